"""The state-retention rule runs when the site node starts and before each run."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from app.config.site_config import SiteConfigError
from app.site_runtime import site_node
from app.site_runtime.site_runner import SiteRunner, expire_state
from clients.site.state_store import SiteStateStore
from tests.app.site_messages import instruction
from tests.app.test_installed_app import CLIENT
from tests.app.test_site_runner_policy import PERMISSIVE, _Started, no_supernode  # noqa: F401
from app.site_runtime.app_approval import fab_sha256, project_fab
from tests.app.tiny_app import write_tiny_app


def _old_state(state: Path, federation: str, days: float) -> Path:
    SiteStateStore(state).save(federation, "ef-residual", np.zeros(2, np.float32))
    then = time.time() - days * 86400
    for path in (state / federation, state / federation / "ef-residual.npy"):
        os.utime(path, (then, then))
    return state / federation


def _node_config(tmp_path: Path, **extra) -> dict:
    return {"data-path": str(tmp_path / "site"), "state-dir": str(tmp_path / "state"),
            "site-name": "h", "policy-path": str(PERMISSIVE), **extra}


def test_the_site_node_expires_old_federation_state_at_start(no_supernode, tmp_path):  # noqa: F811
    old = _old_state(tmp_path / "state", "fed-old", 31)
    kept = _old_state(tmp_path / "state", "fed-recent", 29)
    config = " ".join(f'{k}="{v}"' for k, v in _node_config(tmp_path).items())
    with pytest.raises(_Started):
        site_node.main(["--policy", str(PERMISSIVE), "--", "--port", "9", "--node-config",
                        config])
    assert not old.exists() and kept.exists()


def test_the_runner_expires_state_before_each_run(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))
    for name, value in (("_task_id", 3), ("_run_id", 1), ("_node_id", 7)):
        monkeypatch.setattr(TaskIdentity, name, value)
    fab_bytes = project_fab(write_tiny_app(tmp_path / "tiny", CLIENT))
    fab = SimpleNamespace(hash_str=fab_sha256(fab_bytes), content=fab_bytes)

    def run(run_id: int) -> SimpleNamespace:
        return SimpleNamespace(run_id=run_id, fab_id="fedmed/tinyapp", fab_version="1.0.0")

    runner = SiteRunner("127.0.0.1:9", PERMISSIVE)
    runner.pool = SimpleNamespace(run=lambda key, job, launch: ("done", job["message"],
                                                                job["context"]),
                                  retire=lambda stale: 0)
    context = Context(run_id=1, node_id=7, node_config=_node_config(
        tmp_path, **{"state-retention-days": 10}), state=RecordDict(), run_config={})
    first = _old_state(tmp_path / "state", "fed-a", 11)
    with caplog.at_level(logging.INFO, logger="fedmed.site_runner"):
        runner._answer(instruction("train"), context, run(1), fab)
    assert not first.exists() and "fed-a" in caplog.text and "state-retention-days" in caplog.text
    second = _old_state(tmp_path / "state", "fed-b", 11)
    runner._answer(instruction("train"), context, run(1), fab)
    assert second.exists()  # the same run: no new sweep
    runner._answer(instruction("train"), context, run(2), fab)
    assert not second.exists()


def test_a_bad_retention_option_names_the_key(tmp_path):
    with pytest.raises(SiteConfigError, match="state-retention-days"):
        expire_state(_node_config(tmp_path, **{"state-retention-days": "forever"}))
    assert expire_state(_node_config(tmp_path, **{"state-retention-days": 0})) == []


def test_the_supernode_passes_the_retention_option_as_the_site_reads_it(tmp_path):
    from app.config.site_config import SiteConfig
    from app.site_runtime.one_policy import node_config_of
    from app.site_runtime.supernode import node_config_string
    from app.tooling.errors import FlowerProcessError

    text = node_config_string(tmp_path / "data", tmp_path / "state", "hospital-a", PERMISSIVE, 7)
    node = SiteConfig.from_node_config(node_config_of(["--node-config", text]), "")
    assert node.state_retention_days == 7 and node.state_dir == tmp_path / "state"
    default = node_config_string(tmp_path / "data", tmp_path / "state", "hospital-a", PERMISSIVE)
    assert SiteConfig.from_node_config(node_config_of(["--node-config", default]),
                                       "").state_retention_days == 30
    with pytest.raises(FlowerProcessError, match="state-retention-days"):
        node_config_string(tmp_path, tmp_path, "hospital-a", PERMISSIVE, -1)
