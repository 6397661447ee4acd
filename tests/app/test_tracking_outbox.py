"""Tracking cannot stall the federation: an outbox on disk, bounded MLflow calls, no duplicates."""

from __future__ import annotations

import socket
from pathlib import Path

import mlflow
import numpy as np
import pytest
from flwr.app import Array, ArrayRecord
from mlflow.environment_variables import (
    MLFLOW_HTTP_REQUEST_MAX_RETRIES,
    MLFLOW_HTTP_REQUEST_TIMEOUT,
)
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils import rest_utils

from app.server_app import RoundRecorder
from app.tracking import FLUSH_TIMEOUT_SECONDS, OUTBOX_FILE, FederationTracker, Outbox, round_record
from strategies.rounds.checkpoint import CHECKPOINT_FILE, load_checkpoint, run_folder
from strategies.rounds.round_report import RoundReport


def _report(step: int) -> RoundReport:
    return RoundReport(server_round=step, seconds=0.5 + step,
                       train={"hospital-00": {"train-loss": 1.0 / step}},
                       train_dropped={"hospital-01": "NaN in update"})


def _closed_port_uri() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture()
def store(tmp_path: Path, mlflow_store):
    uri = mlflow_store(tmp_path)
    yield uri
    while mlflow.active_run() is not None:
        mlflow.end_run()


def _tracker(store: str, tmp_path: Path) -> FederationTracker:
    return FederationTracker("pe-seg", tracking_uri=store, artifact_root=str(tmp_path / "art"),
                             experiment="outbox")


def _steps(store: str, run_id: str) -> list[int]:
    return [m.step for m in MlflowClient(store).get_metric_history(run_id, "round-seconds")]


def test_unreachable_mlflow_neither_stalls_nor_fails_a_round_and_catches_up_in_order(
        store, tmp_path, monkeypatch):
    """Found: with MLflow down the federation stalled on MLflow's retries, then failed."""
    tracker = _tracker(store, tmp_path)
    folder = run_folder(tmp_path / "ckpt", "fed")
    run_id = tracker.start("r", {"lr": 0.1}, {}, outbox_dir=folder)
    seen: list[tuple[int, int]] = []
    real = rest_utils.http_request

    def watched(*args, **kwargs):
        seen.append((MLFLOW_HTTP_REQUEST_MAX_RETRIES.get(), MLFLOW_HTTP_REQUEST_TIMEOUT.get()))
        if seen[-1][0] > 0:  # MLflow's default: minutes of retries per call
            raise MlflowException("would retry against the unreachable server")
        return real(*args, **kwargs)

    monkeypatch.setattr(rest_utils, "http_request", watched)
    down = _closed_port_uri()
    mlflow.set_tracking_uri(down)
    tracker.tracking_uri = down
    tracker.log_round(_report(1))  # nothing raises into the round loop
    tracker.log_round(_report(2))
    assert seen and all(retries == 0 and timeout <= FLUSH_TIMEOUT_SECONDS
                        for retries, timeout in seen)
    assert [r.step for r in tracker.outbox.pending] == [1, 2]
    assert [r.step for r in Outbox(folder / OUTBOX_FILE).pending] == [1, 2]  # on disk

    mlflow.set_tracking_uri(store)
    tracker.tracking_uri = store
    tracker.log_round(_report(3))
    assert _steps(store, run_id) == [1, 2, 3]  # every round, once, in order
    assert not tracker.outbox.pending and not Outbox(folder / OUTBOX_FILE).pending
    history = MlflowClient(store).get_metric_history(run_id, "site/hospital-00/train-loss")
    assert [(m.step, m.value) for m in history] == [(1, 1.0), (2, 0.5), (3, 1.0 / 3)]
    tracker.finish()
    assert MlflowClient(store).get_run(run_id).info.status == "FINISHED"


def test_resume_sends_checkpointed_rounds_once_and_drops_the_rest(store, tmp_path):
    """No duplicate step after a resume: sent records and rounds past the checkpoint are dropped."""
    tracker = _tracker(store, tmp_path)
    folder = run_folder(tmp_path / "ckpt", "fed")
    run_id = tracker.start("r", {}, {}, outbox_dir=folder)
    tracker.log_round(_report(1))
    mlflow.end_run()  # the ServerApp dies ...
    outbox = Outbox(folder / OUTBOX_FILE)
    for step in (1, 2, 3):  # ... with step 1 sent but still listed, 2 checkpointed, 3 not
        outbox.append(round_record(_report(step)))
    resumed = _tracker(store, tmp_path)
    resumed.resume(run_id, after_round=2, flwr_run_id="7", outbox_dir=folder)
    assert _steps(store, run_id) == [1, 2]
    assert not Outbox(folder / OUTBOX_FILE).pending
    resumed.log_round(_report(3))  # the repeated round 3
    assert _steps(store, run_id) == [1, 2, 3]


def test_a_line_cut_by_a_crash_is_skipped(tmp_path):
    path = tmp_path / OUTBOX_FILE
    Outbox(path).append(round_record(_report(1)))
    with path.open("a", encoding="utf-8") as handle:
        handle.write('{"step": 2, "timesta')
    assert [r.step for r in Outbox(path).pending] == [1]


class _Strategy:
    def snapshot(self) -> dict:
        return {"sizes": {3: 10}}


class _Tracker:
    """Notes, at each call, which round the checkpoint holds."""

    run_id = federation = "fed"

    def __init__(self, path: Path) -> None:
        self.path, self.events = path, []

    def _saved_round(self):
        return load_checkpoint(self.path, None).server_round if self.path.exists() else None

    def record(self, report: RoundReport) -> None:
        self.events.append(("record", report.server_round, self._saved_round()))

    def flush(self) -> bool:
        self.events.append(("flush", self._saved_round()))
        return True


def test_the_round_is_checkpointed_before_it_is_logged(tmp_path):
    """Found: the checkpoint was written after logging, so a resume logged a step twice."""
    path = run_folder(tmp_path / "ckpt", "fed") / CHECKPOINT_FILE
    tracker = _Tracker(path)
    recorder = RoundRecorder(tracker, _Strategy(), path, {}, lambda report: "progress")
    arrays = ArrayRecord({"w": Array(np.zeros(2, np.float32))})
    recorder(_report(1), arrays)
    recorder(_report(2), arrays)
    assert tracker.events == [("record", 1, None), ("flush", 1),
                              ("record", 2, 1), ("flush", 2)]
