"""MLflow unreachable from round 2 through the end of a federation (issue 29, found 7):
the federation completes, the rounds, the end-of-federation report (test metrics,
cross-site table, figures) and the end (both models, their registration, the run's
status) wait on disk and ``python -m app.tracking.flush`` sends them once, in a
store the test can swap (sqlite); tests/integration/test_tracking_outage_end.py kills a
real ``mlflow server`` instead."""

from __future__ import annotations

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from app.engine import partition_sites, run_federation
from app.server_app import RoundRecorder
from app.tracking import flush
from app.tracking.outbox import FILES_DIR, OUTBOX_FILE, Outbox
from app.tracking.run_end import END_FILE, finish_run
from tests.app.test_tracking_outbox import _closed_port_uri
from tests.integration.conftest import write_small_hospitals


@pytest.fixture()
def unreachable_after_round_1(monkeypatch):
    """From the end of round 1 on, the federation's tracker points at a closed port."""
    down = _closed_port_uri()
    real = RoundRecorder.__call__

    def recorder(self, report, arrays):
        stop = real(self, report, arrays)
        if report.server_round == 1:
            self.tracker.tracking_uri = down
            mlflow.set_tracking_uri(down)
        return stop

    monkeypatch.setattr(RoundRecorder, "__call__", recorder)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # no minutes of retries
    return down


def test_an_unreachable_mlflow_at_the_end_fails_nothing_and_the_flush_sends_it_once(
        tmp_path, mlflow_store, unreachable_after_round_1):
    store = mlflow_store(tmp_path / "mlflow")
    write_small_hospitals(tmp_path / "data", seed=3)
    outcome = run_federation({
        "num-server-rounds": 2, "local-steps": 1, "image-size": 32, "batch-size": 4,
        "node-wait-timeout": 5, "experiment": "end", "data-root": str(tmp_path / "data"),
        "tracking-uri": store, "artifact-root": str(tmp_path / "artifacts"),
        "checkpoint-dir": str(tmp_path / "checkpoints"), "cross-site.finetune-steps": 0,
        "tracking.end-wait-s": 0.0}, partition_sites(2), run_id=7)
    folder = tmp_path / "checkpoints" / outcome.mlflow_run_id
    assert sorted(outcome.reports) == [1, 2] and outcome.models.final_uri == ""
    assert (folder / END_FILE).is_file()
    assert [r.step for r in Outbox(folder / OUTBOX_FILE).pending] == [2, 3]  # 3: the test
    client = MlflowClient(store)
    assert client.get_run(outcome.mlflow_run_id).info.status == "RUNNING"
    assert mlflow.active_run() is None  # the run is left open in MLflow, not in this process

    assert flush.main([str(tmp_path / "checkpoints"), "--tracking-uri", store]) == 0
    run = client.get_run(outcome.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "round-seconds")] \
        == [1, 2]
    assert "test/dice" in run.data.metrics  # the end-of-federation report, step 3
    logged = {a.path for folder in ("cross-site", "figures")
              for a in client.list_artifacts(run.info.run_id, folder)}
    assert {"cross-site/matrix.json", "figures/tau.png", "figures/validation.png"} <= logged
    assert not list((folder / FILES_DIR).iterdir())  # sent, then deleted
    versions = {v.name: v for v in client.search_model_versions("name LIKE 'end-%'")}
    assert sorted(versions) == ["end-best", "end-final"]
    assert versions["end-best"].tags["round"] == run.data.tags["best-round"]
    assert not (folder / END_FILE).exists() and not list(folder.glob("*.safetensors"))

    assert flush.main([str(folder), "--tracking-uri", store]) == 0  # again: nothing twice
    assert flush.waiting_folders(tmp_path / "checkpoints") == []
    assert len(client.search_model_versions("name LIKE 'end-%'")) == 2


class _Tracker:
    """The outbox side of a tracker: MLflow answers from try ``answer_from`` on."""

    run_id = "r"

    def __init__(self, answer_from: int) -> None:
        self.answer_from, self.tries, self.outbox = answer_from, 0, Outbox()

    def flush(self, quiet: bool = False) -> bool:
        self.tries += 1
        return self.tries >= self.answer_from


class _End:
    """An end whose send succeeds (MLflow answers once the outbox went through)."""

    tracking_uri, run_id, status, folder, sent = "http://mlflow", "r", "FINISHED", None, 0

    def opened_as(self, run_id: str) -> None:
        assert run_id == self.run_id  # opened at the start: nothing changes

    def send(self) -> str:
        self.sent += 1
        return "models"

    def waiting(self) -> str:
        return "waiting"


def test_the_bounded_wait_retries_until_mlflow_answers_and_not_past_its_bound():
    """``tracking.end-wait-s``: tried again every 5 s until MLflow answers, never past it."""
    now, slept = [0.0], []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    tracker, end = _Tracker(answer_from=3), _End()
    assert finish_run(tracker, end, 60.0, sleep=sleep, clock=lambda: now[0]) == "models"
    assert tracker.tries == 3 and end.sent == 1 and slept == [5.0, 5.0]
    tracker, end, slept[:] = _Tracker(answer_from=100), _End(), []
    assert finish_run(tracker, end, 7.0, sleep=sleep, clock=lambda: now[0]) == "waiting"
    assert tracker.tries == 3 and end.sent == 0 and slept == [5.0, 2.0]  # gave up at 7 s


def test_the_summary_with_mlflow_down_names_the_flush_command_and_does_not_raise(
        monkeypatch, capsys):
    """``make simulate`` printed its summary from MLflow: with MLflow down it raised after the
    federation completed (exit 1)."""
    from app.tooling.federation_summary import print_summary  # noqa: PLC0415 - MLflow

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the old code: fail fast
    down = _closed_port_uri()
    print_summary(down, 7, 12.0, "/tmp/artifacts")
    out = capsys.readouterr().out
    assert f"MLflow at {down} does not answer" in out
    assert f"make tracking-flush RUN_DIR=<that folder> TRACKING_URI={down}" in out
