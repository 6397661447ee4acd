"""What the worker is given of the site: its own state folder, a copy of the data rules, a
node config naming both (and that the runtime owns the ledger)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from flwr.app import Context, RecordDict

from app.config.site_config import SiteConfig
from app.site_runtime.worker_view import (data_rules_toml, prepare_worker_state,
                                          worker_context, write_worker_policy)
from clients.site.policy import load_policy

ROOT = Path(__file__).resolve().parents[2]


def test_an_earlier_state_dir_is_moved_into_the_workers_folder_once(tmp_path):
    state = tmp_path / "state"
    for folder in ("fed-1", "decoded-cache", "privacy/abc", "audit", "console", "runtime"):
        (state / folder).mkdir(parents=True)
    (state / "fed-1" / "residual.npy").write_bytes(b"x")
    (state / "notes.txt").write_text("the hospital's own file")
    worker = prepare_worker_state(state)
    assert sorted(p.name for p in worker.iterdir()) == ["decoded-cache", "fed-1"]
    assert (worker / "fed-1" / "residual.npy").read_bytes() == b"x"
    assert sorted(p.name for p in state.iterdir()) == [
        "audit", "console", "notes.txt", "privacy", "runtime", "worker"]
    assert prepare_worker_state(state) == worker  # nothing left to move


def test_the_workers_copy_holds_the_same_data_rules_and_nothing_else(tmp_path):
    policy = load_policy(ROOT / "configs" / "site-policy.toml")
    copy = load_policy(write_worker_policy(tmp_path, policy))
    runtime_only = {"apps", "audit", "sandbox", "fingerprint"}
    for field in dataclasses.fields(policy):
        if field.name not in runtime_only:
            assert getattr(copy, field.name) == getattr(policy, field.name), field.name
    text = data_rules_toml(policy)
    assert "[apps]" not in text and "[audit]" not in text and "sandbox" not in text


def test_the_worker_context_points_at_its_own_view_and_leaves_the_runtimes(tmp_path):
    node_config = {"data-path": str(tmp_path / "site"), "state-dir": str(tmp_path / "state"),
                   "site-name": "hospital-a", "policy-path": "/etc/fedmed/policy.toml"}
    context = Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(),
                      run_config={})
    worker = worker_context(context, tmp_path / "state", tmp_path / "copy.toml")
    site = SiteConfig.from_node_config(worker.node_config, data_root="")
    assert site.state_dir == tmp_path / "state" / "worker"
    assert site.policy_path == tmp_path / "copy.toml" and site.runtime_ledger
    assert context.node_config == node_config  # the runtime's own is untouched
    assert not SiteConfig.from_node_config(node_config, data_root="").runtime_ledger
