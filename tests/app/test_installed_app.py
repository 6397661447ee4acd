"""An approved bundle's install is re-verified before every message: an edited install is
detected, logged, and re-installed from the verified bundle before anything of it runs; an
unchanged one costs no file read (its stat signature vouches for it)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from flwr.app import Context, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from app.site_runtime import installed_app, site_runner
from app.site_runtime.app_approval import fab_sha256, project_fab
from app.site_runtime.site_runner import SiteRunner
from tests.app.site_messages import instruction
from tests.app.test_site_runner_policy import PERMISSIVE
from tests.app.tiny_app import write_tiny_app

CLIENT = "from flwr.clientapp import ClientApp\napp = ClientApp()\n"


class _Pool:
    """A worker pool that records what it was asked instead of starting workers."""

    def __init__(self, apps: Path) -> None:
        self.apps = apps
        self.ran: list[str] = []
        self.discarded: list[str] = []

    def run(self, key, job, launch=None):
        installed = next(self.apps.iterdir())
        self.ran.append((installed / "tinyapp_client.py").read_text())
        return ("done", job["message"], job["context"])

    def discard(self, fab_hash: str) -> None:
        self.discarded.append(fab_hash)

    def retire(self, stale) -> int:  # no workers: none is stale
        return 0


def _answerer(tmp_path: Path, monkeypatch) -> tuple[Callable[[], Any], _Pool, str]:
    """``answer()`` (a train message's answer from a runner with a recording pool), the
    pool and the bundle's hash."""
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))
    fab_bytes = project_fab(write_tiny_app(tmp_path / "tiny", CLIENT))
    fab = SimpleNamespace(hash_str=fab_sha256(fab_bytes), content=fab_bytes)
    runner = SiteRunner("127.0.0.1:9", PERMISSIVE)
    runner.pool = pool = _Pool(tmp_path / "flwr-home" / "apps")
    (tmp_path / "site").mkdir()
    context = Context(run_id=1, node_id=7, node_config={
        "site-name": "h", "policy-path": str(PERMISSIVE), "data-path": str(tmp_path / "site"),
        "state-dir": str(tmp_path / "state")}, state=RecordDict(), run_config={})
    run = SimpleNamespace(run_id=1, fab_id="fedmed/tinyapp", fab_version="1.0.0")
    for name, value in (("_task_id", 3), ("_run_id", 1), ("_node_id", 7)):
        monkeypatch.setattr(TaskIdentity, name, value)  # as pull_task_input sets them

    def answer() -> Any:
        return runner._answer(instruction("train"), context, run, fab)

    return answer, pool, fab.hash_str


def test_an_edited_install_is_reinstalled_from_the_verified_bundle(tmp_path, monkeypatch,
                                                                   caplog):
    answered, pool, fab_hash = _answerer(tmp_path, monkeypatch)

    def answer() -> str:  # whether the message reached the (recording) worker
        before = len(pool.ran)
        answered()
        return "ran" if len(pool.ran) > before else "not run"

    assert answer() == "ran"
    installed = next((tmp_path / "flwr-home" / "apps").iterdir())
    (installed / "tinyapp_client.py").write_text(CLIENT + "import os  # the edit\n")
    (installed / "extra.py").write_text("print('not in the bundle')\n")
    with caplog.at_level(logging.WARNING, logger="fedmed.site_runner"):
        assert answer() == "ran"
    assert pool.ran == [CLIENT, CLIENT]  # the edited file never ran
    assert not (installed / "extra.py").exists()
    assert pool.discarded == [fab_hash]  # its warm workers were stopped
    assert "tinyapp_client.py" in caplog.text and "extra.py" in caplog.text
    assert "re-installed" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedmed.site_runner"):
        assert answer() == "ran"
    assert "re-installed" not in caplog.text and pool.discarded == [fab_hash]


def test_a_warm_message_reads_no_file_of_an_unchanged_install(tmp_path, monkeypatch):
    monkeypatch.setattr(installed_app, "RACY_NS", 0)  # as if installed long ago
    answer, _, _ = _answerer(tmp_path, monkeypatch)
    answer()
    apps = tmp_path / "flwr-home" / "apps"
    read: list[object] = []
    checked: list[list[str]] = []
    read_bytes = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes",
                        lambda path: read.append(path) or read_bytes(path))
    install = installed_app.install_from_fab
    monkeypatch.setattr(installed_app, "install_from_fab",
                        lambda *a, **k: read.append("install") or install(*a, **k))
    verify = site_runner.verified_install

    def verified(content: bytes) -> tuple[Path, list[str]]:
        folder, differences = verify(content)
        checked.append(differences)
        return folder, differences

    monkeypatch.setattr(site_runner, "verified_install", verified)
    for _ in range(3):
        answer()
    assert checked == [[], [], []]  # the install was checked before each message
    assert [p for p in read if not isinstance(p, Path) or p.is_relative_to(apps)] == []
