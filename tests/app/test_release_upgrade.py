"""Upgrade: what the previous release (054dc2f) left on disk is read by this one (#47 item 6).

The fixtures (tests/fixtures/releases/, README.md there) were written by that release's own
deployment: a TLS SuperLink, two hospitals, a two-round DP-SGD federation. Each test works
on a copy in tmp and checks what this release reads against what the old code read
(``expected.json``), then writes through this release's own API and reads again. The
SuperLink's databases are checked by tests/integration/test_release_upgrade_superlink.py.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest

from app.config.run_config import RunConfig
from app.server_app import build_strategy
from app.site_runtime import audit_chain
from app.site_runtime.audit_log import AuditLog
from app.site_runtime.runtime_ledger import PlannedSpend, reserve
from app.site_runtime.site_audit import SiteAudit
from app.tooling.registration import read_registry
from app.tooling.state_migrations import COORDINATOR, SITE_STATE, migrate_folder
from clients.site.policy import load_policy
from clients.site.privacy_ledger import PRIVACY_DIR, PrivacyLedger, dataset_id
from clients.training.private_training import DpSettings
from strategies.rounds.checkpoint import CHECKPOINT_FILE, find_checkpoint, load_checkpoint

RELEASE = Path(__file__).resolve().parents[1] / "fixtures" / "releases" / "054dc2f"
EXPECTED = json.loads((RELEASE / "expected.json").read_text(encoding="utf-8"))
SITES = sorted(EXPECTED["sites"])


@pytest.fixture
def release(tmp_path: Path) -> Path:
    """A copy of the fixture, as a hospital or coordinator would restore it.

    The anchors name their log by its absolute path (``log``), which was the old
    deployment's; the copy's anchor file names the copy's.
    """
    copy = tmp_path / "054dc2f"
    shutil.copytree(RELEASE, copy)
    for site in SITES:
        anchor = copy / "sites" / site / "anchor.log"
        if anchor.is_file():
            audit = str((copy / "sites" / site / "state" / "audit").resolve())
            lines = [json.loads(line) for line in anchor.read_text().splitlines() if line]
            anchor.write_text("".join(json.dumps({**line, "log": audit}, sort_keys=True,
                                                 separators=(",", ":")) + "\n"
                                      for line in lines))
    return copy


def _verify(state: Path, anchor: Path, capsys) -> str:
    """``fedmed audit verify`` (the product's verifier) on ``state``; its one line."""
    capsys.readouterr()
    argv = ["--state", str(state), "--anchor", str(anchor) if anchor.is_file() else "none"]
    code = audit_chain.main(argv)
    line = capsys.readouterr().out.strip()
    assert code == 0, line
    return line


@pytest.mark.parametrize("site", SITES)
def test_a_site_state_folder_reads_as_the_old_release_read_it(release, site, capsys):
    expected = EXPECTED["sites"][site]
    state = release / "sites" / site / "state"
    assert migrate_folder(state, SITE_STATE).found == 0  # what the SuperNode's start runs
    ledgers = {folder.name: PrivacyLedger(folder, EXPECTED["accountant"])
               for folder in sorted((state / PRIVACY_DIR).iterdir()) if folder.is_dir()}
    assert sorted(ledgers) == sorted(expected["ledgers"]) == [expected["dataset-id"]]
    assert dataset_id(expected["data-path"]) == expected["dataset-id"]
    for name, old in expected["ledgers"].items():
        assert len(ledgers[name].entries) == old["entries"] > 0
        assert ledgers[name].epsilon(EXPECTED["delta"]) == pytest.approx(old["epsilon"],
                                                                          rel=1e-9)
    line = _verify(state, release / "sites" / site / "anchor.log", capsys)
    audit = expected["audit"]
    assert line.startswith(f"audit log OK: {audit['records']} records, head {audit['head']}")
    if audit["anchors"]:
        assert f"({audit['anchors']} anchor" in line, line


@pytest.mark.parametrize("site", SITES)
def test_a_new_charge_and_record_append_to_the_old_ledger_and_log(release, site, tmp_path,
                                                                  capsys):
    expected = EXPECTED["sites"][site]
    state = release / "sites" / site / "state"
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text(expected["policy"].split("\n[audit]")[0])  # anchors: the old path
    policy = load_policy(policy_file)
    old = expected["ledgers"][expected["dataset-id"]]
    privacy = DpSettings(noise_multiplier=1.0, max_grad_norm=1.0, delta=EXPECTED["delta"],
                         accountant=EXPECTED["accountant"])
    # The site's data folder is named by its path, as the node config names it; the
    # ledger is keyed by that path's hash, so the charge goes to the old dataset's ledger.
    reservation = reserve(state, Path(expected["data-path"]), policy,
                          PlannedSpend("train", 2, privacy, 4), examples=40,
                          federation="after-upgrade")
    assert reservation.spent == pytest.approx(old["epsilon"], rel=1e-9)
    metrics = reservation.settle(None)
    ledger = PrivacyLedger(state / PRIVACY_DIR / expected["dataset-id"], EXPECTED["accountant"])
    assert len(ledger.entries) == old["entries"] + 1
    assert ledger.entries[-1].federation == "after-upgrade" and not ledger.entries[-1].reservation
    assert metrics["epsilon"] == pytest.approx(ledger.epsilon(EXPECTED["delta"]))
    assert metrics["epsilon"] > old["epsilon"]
    audit = SiteAudit(state, site)
    audit.node_started("after-upgrade")
    written = audit.message({"kind": "message", "run": 1, "type": "train", "verdict": "ok"})
    assert written is not None and written["seq"] >= expected["audit"]["records"]
    first_new = next(r for r in AuditLog(state).records()
                     if r["seq"] == expected["audit"]["records"])
    assert first_new["prev"] == expected["audit"]["head"]  # chained onto the old head
    line = _verify(state, release / "sites" / site / "anchor.log", capsys)
    assert line.startswith(f"audit log OK: {written['seq'] + 1} records, head "
                           f"{written['hash']}"), line


def test_the_old_server_checkpoint_resumes_with_this_release(release):
    saved = EXPECTED["checkpoint"]
    path = release / saved["file"]
    federation = saved["mlflow-run-id"]
    folder = release / "resume" / federation  # a federation's folder: <checkpoint-dir>/<run>/
    folder.mkdir(parents=True)
    os.chmod(folder, 0o700)  # the checkpoint folder is private (git keeps no modes)
    shutil.copy2(path, folder / CHECKPOINT_FILE)
    raw = load_checkpoint(folder / CHECKPOINT_FILE, None)
    assert (raw.server_round, len(raw.keys), raw.mlflow_run_id) == (
        saved["server-round"], saved["keys"], federation)
    # As `make federate RESUME=1` reads it: the run config it was started with, as this
    # release builds it, finds the checkpoint and restores the strategy's state onto it.
    config = RunConfig.from_mapping(raw.run_config)
    defaults = RunConfig().as_params()
    found = find_checkpoint(release / "resume", config.as_params(), defaults)
    strategy = build_strategy(config, federation=federation)
    checkpoint = load_checkpoint(found, config.as_params(), template=strategy.snapshot(),
                                 defaults=defaults)
    strategy.restore(checkpoint.strategy)
    assert checkpoint.server_round == saved["server-round"]
    assert all(math.isfinite(float(a.sum())) for a in checkpoint.arrays)


def test_the_coordinator_registry_reads_as_the_old_release_wrote_it(release):
    folder = release / "superlink"
    assert migrate_folder(folder, COORDINATOR).found == 0  # what the SuperLink's start runs
    registry = read_registry(folder / "sites.json")
    assert {site: int(entry["node-id"]) for site, entry in registry.items()} == {
        site: EXPECTED["sites"][site]["node-id"] for site in SITES}
    assert sorted(entry["node-id"] for entry in registry.values()) == EXPECTED["listed-node-ids"]
