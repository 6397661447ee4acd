"""An MLflow outage across the last round and the end of a federation loses nothing and
fails nothing (issue 29, found 7): a real ``mlflow server`` process is killed after round
1 and started again only once the rounds are over; the federation (the in-process
engine) completes, and every round, the end-of-federation report, both models, their
registration and the run's status reach MLflow: from the ServerApp's bounded wait at the end
(``tracking.end-wait-s``), or afterwards from ``make tracking-flush``
(``python -m app.tracking.flush``)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from app.engine import partition_sites, run_federation
from app.server_app import RoundRecorder
from app.tracking import flush
from app.tracking.outbox import OUTBOX_FILE, Outbox
from app.tooling.process_tree import descendants
from app.tracking.run_end import END_FILE
from app.tracking.run_start import RUN_FILE, RunStart
from tests.fixtures.mlflow_server import MlflowServerProcess
from tests.integration.conftest import write_small_hospitals

pytestmark = pytest.mark.integration

ROUNDS = 3
#: This machine's slowest `mlflow server` start seen (2 loaded cores) was over a minute.
STARTUP_TIMEOUT = 300


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory, mlflow_store) -> Iterator[dict[str, MlflowServerProcess]]:
    """One real server for the module, in a holder: a test that restarts it puts the new one."""
    tmp = tmp_path_factory.mktemp("mlflow-server")
    holder = {"server": MlflowServerProcess.start(mlflow_store(tmp / "store"), tmp / "artifacts",
                                                  tmp / "mlflow.log",
                                                  startup_timeout=STARTUP_TIMEOUT)}
    yield holder
    holder["server"].stop()


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("outage-data")
    write_small_hospitals(root, seed=7)
    return root


def _federate(tmp: Path, data_root: Path, server: MlflowServerProcess, wait_s: float,
              monkeypatch, experiment: str, during_end=None):
    """A 3-round federation whose MLflow is killed once round 1 is recorded; returns its
    outcome, the seconds from the last round's end to the federation's return, and the
    server (restarted by ``during_end`` when given)."""
    ends: dict[int, float] = {}
    real = RoundRecorder.__call__

    def recorder(self, report, arrays):
        stop = real(self, report, arrays)
        ends[report.server_round] = time.monotonic()
        if report.server_round == 1:
            server.kill()  # rounds 2-3 and the end without MLflow
        return stop

    monkeypatch.setattr(RoundRecorder, "__call__", recorder)
    outcome = run_federation({
        "num-server-rounds": ROUNDS, "local-steps": 2, "image-size": 32, "batch-size": 4,
        "node-wait-timeout": 5, "experiment": experiment, "data-root": str(data_root),
        "tracking-uri": server.uri, "checkpoint-dir": str(tmp / "checkpoints"),
        "cross-site.finetune-steps": 0, "tracking.end-wait-s": wait_s},
        partition_sites(2), run_id=29)
    return outcome, time.monotonic() - ends[ROUNDS], ends


def _round_seconds(outcome) -> dict[int, float]:
    return {r: round(report.seconds, 2) for r, report in sorted(outcome.reports.items())}


def _assert_everything_in_mlflow(uri: str, run_id: str, experiment: str) -> None:
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    for key in ("round-seconds", "eval/val-dice", "train/train-loss"):
        assert sorted(m.step for m in client.get_metric_history(run_id, key)) == [1, 2, 3], key
    mlflow.set_tracking_uri(uri)
    models = mlflow.search_logged_models(experiment_ids=[run.info.experiment_id],
                                         output_format="list",
                                         filter_string=f"source_run_id = '{run_id}'")
    assert sorted(m.name for m in models) == ["best-model", "global-model"]  # each once
    for suffix in ("best", "final"):
        versions = client.search_model_versions(f"name = '{experiment}-{suffix}'")
        assert [v.run_id for v in versions] == [run_id], suffix
    assert "test/dice" in run.data.metrics  # the end-of-federation report (step 4)
    assert run.data.tags["best-round"] in {"1", "2", "3"}
    assert len(client.get_metric_history(run_id, "best-round")) == 1


def _restart_once(mlflow_server: dict[str, MlflowServerProcess], checkpoints: Path,
                  waiting_file: str) -> tuple[threading.Thread, dict[str, float]]:
    """A thread that starts the (stopped) server again once a federation's folder under
    ``checkpoints`` holds ``waiting_file``; the times it was asked and answered."""
    server, restarted = mlflow_server["server"], {}

    def restart() -> None:
        while not list(checkpoints.glob(f"*/{waiting_file}")):
            time.sleep(0.2)
        restarted["at"] = time.monotonic()
        mlflow_server["server"] = server.restart(startup_timeout=STARTUP_TIMEOUT)
        restarted["back"] = time.monotonic()

    thread = threading.Thread(target=restart, daemon=True)
    thread.start()
    return thread, restarted


def test_the_flush_command_sends_what_an_outage_across_the_end_left(
        tmp_path, data_root, mlflow_server, monkeypatch):
    """Found: the end of the run needed MLflow and raised; the federation failed, the run
    stayed RUNNING with round 1 only and no model was logged."""
    server = mlflow_server["server"]
    outcome, end_seconds, _ = _federate(tmp_path, data_root, server, 1.0, monkeypatch,
                                        "outage-flush")
    folder = tmp_path / "checkpoints" / outcome.mlflow_run_id
    assert sorted(outcome.reports) == [1, 2, 3]  # completed, nothing raised
    assert outcome.models.final_uri == "" and outcome.models.best_version == ""
    assert (folder / END_FILE).is_file()
    assert [r.step for r in Outbox(folder / OUTBOX_FILE).pending] == [2, 3, 4]  # 4: the test

    mlflow_server["server"] = server = server.restart(startup_timeout=STARTUP_TIMEOUT)
    started = time.monotonic()
    assert flush.main([str(tmp_path / "checkpoints")]) == 0  # the run's own tracking URI
    flush_seconds = time.monotonic() - started
    _assert_everything_in_mlflow(server.uri, outcome.mlflow_run_id, "outage-flush")
    assert not (folder / END_FILE).exists() and not Outbox(folder / OUTBOX_FILE).pending

    assert flush.main([str(folder), "--tracking-uri", server.uri]) == 0  # again: nothing twice
    assert flush.waiting_folders(tmp_path / "checkpoints") == []
    _assert_everything_in_mlflow(server.uri, outcome.mlflow_run_id, "outage-flush")
    print("\nMLflow outage across the end, then make tracking-flush: " + json.dumps({
        "round_seconds": _round_seconds(outcome), "end_seconds": round(end_seconds, 2),
        "flush_seconds": round(flush_seconds, 2)}))


def test_the_bounded_wait_at_the_end_sends_everything_once_mlflow_is_back(
        tmp_path, data_root, mlflow_server, monkeypatch):
    """MLflow restarted while the ServerApp waits at the end (``tracking.end-wait-s``):
    the ServerApp itself sends the rounds, the models, their versions and the status."""
    server = mlflow_server["server"]
    checkpoints = tmp_path / "checkpoints"
    thread, restarted = _restart_once(mlflow_server, checkpoints, END_FILE)
    outcome, end_seconds, ends = _federate(tmp_path, data_root, server, STARTUP_TIMEOUT + 60,
                                           monkeypatch, "outage-wait")
    thread.join(timeout=STARTUP_TIMEOUT)
    folder = checkpoints / outcome.mlflow_run_id
    assert outcome.models.final_uri and outcome.models.best_version == "models:/outage-wait-best/1"
    assert not (folder / END_FILE).exists() and not Outbox(folder / OUTBOX_FILE).pending
    _assert_everything_in_mlflow(mlflow_server["server"].uri, outcome.mlflow_run_id,
                                 "outage-wait")
    assert flush.main([str(checkpoints)]) == 0  # nothing left for the command
    print("\nMLflow outage across the end, drained by the bounded wait: " + json.dumps({
        "round_seconds": _round_seconds(outcome), "end_seconds": round(end_seconds, 2),
        "mlflow_restart_seconds": round(restarted["back"] - restarted["at"], 2),
        "end_after_mlflow_back_seconds": round(ends[ROUNDS] + end_seconds - restarted["back"],
                                               2)}))


def test_the_tests_mlflow_server_starts_no_job_runner(mlflow_server):
    """Issue 47, found 2: MLflow 3's ``mlflow server`` starts 4-5 huey consumers unless told
    not to; on 2 cores they competed with the federation under test."""
    server = mlflow_server["server"]
    commands = []
    for pid, _ in descendants(server.process.pid):
        try:
            commands.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" "))
        except OSError:
            continue  # ended meanwhile
    assert commands and not any(b"huey" in c for c in commands), commands


def test_a_federation_started_while_mlflow_is_down_sends_its_run_once_mlflow_answers(
        tmp_path, data_root, mlflow_server):
    """Issue 47, item 4: MLflow down at the start of the run. The federation starts under an
    id of its own; the real server, started only once the start waits in
    ``tracking-run.json``, gets the run, its params, every round and the end from the
    ServerApp itself. Found: the tracker raised before round 1."""
    server = mlflow_server["server"]
    server.kill()
    checkpoints = tmp_path / "checkpoints"
    thread, restarted = _restart_once(mlflow_server, checkpoints, RUN_FILE)
    outcome = run_federation({
        "num-server-rounds": ROUNDS, "local-steps": 2, "image-size": 32, "batch-size": 4,
        "node-wait-timeout": 5, "experiment": "outage-start", "data-root": str(data_root),
        "tracking-uri": server.uri, "checkpoint-dir": str(checkpoints),
        "cross-site.finetune-steps": 0, "tracking.end-wait-s": STARTUP_TIMEOUT + 60},
        partition_sites(2), run_id=47)
    thread.join(timeout=STARTUP_TIMEOUT)
    (folder,) = checkpoints.iterdir()
    opened = RunStart.load(folder)
    assert opened is not None and opened.mlflow_run_id == outcome.mlflow_run_id != folder.name
    assert outcome.models.best_version == "models:/outage-start-best/1"
    _assert_everything_in_mlflow(mlflow_server["server"].uri, outcome.mlflow_run_id,
                                 "outage-start")
    client = MlflowClient(mlflow_server["server"].uri)
    run = client.get_run(outcome.mlflow_run_id)
    assert run.data.params["num-server-rounds"] == str(ROUNDS)
    assert run.data.tags["flwr.run-id"] == "47"
    assert len(client.search_runs([run.info.experiment_id])) == 1
    assert not (folder / END_FILE).exists() and not Outbox(folder / OUTBOX_FILE).pending
    print("\nMLflow down at the start, started once the federation ran: " + json.dumps({
        "round_seconds": _round_seconds(outcome),
        "mlflow_start_seconds": round(restarted["back"] - restarted["at"], 2)}))
