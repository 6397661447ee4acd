"""One record MLflow refuses never stops the rounds after it (issue #29, found 4).

A reply under a 300-character site name made MLflow refuse the round's metric
names (its limit is 250); the outbox sends in order, so no later round reached
MLflow. Now every metric and param name is checked against MLflow's rules
before it is sent, and a record MLflow refuses anyway is set aside in
``tracking-rejected.jsonl`` beside the outbox, with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from app.tracking import OUTBOX_FILE, FederationTracker, Outbox, RoundRecord
from app.tracking.outbox import REJECTED_FILE
from app.tracking.tracker import mlflow_name_problem
from strategies.rounds.checkpoint import run_folder
from tests.app.test_tracking_outbox import store  # noqa: F401 - the fixture: a sqlite store
from strategies.rounds.round_report import RoundReport

LONG = "h" * 300


def _started(store: str, tmp_path: Path) -> tuple[FederationTracker, Path, str]:
    tracker = FederationTracker("pe-seg", tracking_uri=store,
                                artifact_root=str(tmp_path / "art"), experiment="poisoned")
    folder = run_folder(tmp_path / "ckpt", "fed")
    return tracker, folder, tracker.start("r", {}, {}, outbox_dir=folder)


def _report(step: int, site: str = "hospital-00") -> RoundReport:
    return RoundReport(server_round=step, seconds=float(step),
                       train={site: {"train-loss": 1.0 / step},
                              "hospital-01": {"train-loss": 2.0 / step}},
                       policies={site: f"fp{step}"})


def _steps(store: str, run_id: str, key: str = "round-seconds") -> list[int]:
    return [m.step for m in MlflowClient(store).get_metric_history(run_id, key)]


def _rejected(folder: Path) -> list[dict]:
    lines = (folder / REJECTED_FILE).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def test_a_poisoned_site_name_in_round_2_keeps_its_round_valid_part_and_every_later_round(
        store, tmp_path):
    tracker, folder, run_id = _started(store, tmp_path)
    for step in (1, 2, 3, 4):
        tracker.log_round(_report(step, site=LONG if step == 2 else "hospital-00"))
    assert _steps(store, run_id) == [1, 2, 3, 4]
    assert _steps(store, run_id, "site/hospital-01/train-loss") == [1, 2, 3, 4]
    assert _steps(store, run_id, "site/hospital-00/train-loss") == [1, 3, 4]
    assert not tracker.outbox.pending and not Outbox(folder / OUTBOX_FILE).pending
    [aside] = _rejected(folder)
    assert aside["step"] == 2
    assert sorted(aside["metrics"]) == [f"site/{LONG}/failed", f"site/{LONG}/train-loss"]
    assert sorted(aside["params"]) == [f"site/{LONG}/policy"]
    assert "250" in aside["reason"]


def test_a_record_mlflow_refuses_is_set_aside_and_the_next_rounds_go_on(store, tmp_path):
    """A record queued before the check (an older outbox) that MLflow refuses."""
    tracker, folder, run_id = _started(store, tmp_path)
    tracker.log_round(_report(1))
    tracker.outbox.append(RoundRecord(step=2, timestamp_ms=1, metrics={
        f"site/{LONG}/train-loss": 1.0, "round-seconds": 2.0}))
    tracker.log_round(_report(3))
    tracker.log_round(_report(4))
    assert _steps(store, run_id) == [1, 3, 4]
    assert not Outbox(folder / OUTBOX_FILE).pending
    [aside] = _rejected(folder)
    assert aside["step"] == 2 and "INVALID_PARAMETER_VALUE" in aside["reason"]
    tracker.finish()
    assert MlflowClient(store).get_run(run_id).info.status == "FINISHED"


@pytest.mark.parametrize("name", ["a" * 251, "a\tb", "a?b", "../x", "/x", "a//b"])
def test_names_mlflow_would_refuse_are_found_before_sending(name):
    assert mlflow_name_problem(name) is not None
    assert mlflow_name_problem("site/hospital-00/val-dice") is None
    assert mlflow_name_problem("a" * 250) is None
