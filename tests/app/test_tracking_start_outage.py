"""MLflow unreachable from the very start of a federation (issue 47, item 4): the
federation runs anyway under an id of its own, the start of its MLflow run waits in
``tracking-run.json`` beside the outbox and the end, and ``python -m app.tracking.flush``
opens the run, sends the rounds and the end once, in a store the test swaps in (sqlite);
tests/integration/test_tracking_outage_end.py starts a real ``mlflow server`` late instead."""

from __future__ import annotations

import mlflow
from mlflow.tracking import MlflowClient

from app.engine import partition_sites, run_federation
from app.tracking import flush
from app.tracking.outbox import OUTBOX_FILE, Outbox
from app.tracking.run_end import END_FILE, RunEnd
from app.tracking.run_start import RUN_FILE, RunStart
from app.tracking.tracker import FederationTracker
from tests.app.test_tracking_outbox import _closed_port_uri
from tests.integration.conftest import write_small_hospitals


def test_a_federation_started_without_mlflow_completes_and_the_flush_opens_its_run_once(
        tmp_path, mlflow_store, monkeypatch):
    """Found: the tracker asked MLflow for the experiment and the run before round 1 and
    raised, so no federation started while MLflow was down."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    write_small_hospitals(tmp_path / "data", seed=5)
    outcome = run_federation({
        "num-server-rounds": 2, "local-steps": 1, "image-size": 32, "batch-size": 4,
        "node-wait-timeout": 5, "experiment": "start", "data-root": str(tmp_path / "data"),
        "tracking-uri": _closed_port_uri(), "artifact-root": str(tmp_path / "artifacts"),
        "checkpoint-dir": str(tmp_path / "checkpoints"), "cross-site.finetune-steps": 0,
        "tracking.end-wait-s": 0.0}, partition_sites(2), run_id=47)
    (folder,) = (tmp_path / "checkpoints").iterdir()
    assert sorted(outcome.reports) == [1, 2] and outcome.mlflow_run_id == ""
    waiting = RunStart.load(folder)
    assert waiting is not None and waiting.federation == folder.name
    assert waiting.mlflow_run_id == "" and waiting.tags["flwr.run-id"] == "47"
    assert [r.step for r in Outbox(folder / OUTBOX_FILE).pending] == [1, 2, 3]  # 3: the test
    assert (folder / END_FILE).is_file() and mlflow.active_run() is None

    store = mlflow_store(tmp_path / "mlflow")
    assert flush.main([str(tmp_path / "checkpoints"), "--tracking-uri", store]) == 0
    opened = RunStart.load(folder)
    assert opened is not None and opened.mlflow_run_id and opened.params_sent
    assert opened.mlflow_run_id != folder.name  # the federation keeps its own id
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("start").experiment_id])
    assert run.info.run_id == opened.mlflow_run_id and run.info.status == "FINISHED"
    assert run.data.params["num-server-rounds"] == "2" and run.data.tags["flwr.run-id"] == "47"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "round-seconds")] \
        == [1, 2]
    assert "test/dice" in run.data.metrics
    assert sorted(v.name for v in client.search_model_versions("name LIKE 'start-%'")) \
        == ["start-best", "start-final"]
    assert RunEnd.load(folder) is None and not Outbox(folder / OUTBOX_FILE).pending

    assert flush.main([str(folder), "--tracking-uri", store]) == 0  # again: nothing twice
    assert len(client.search_runs([run.info.experiment_id])) == 1
    assert len(client.search_model_versions("name LIKE 'start-%'")) == 2
    assert (folder / RUN_FILE).is_file()  # the federation's MLflow run, for a resume


def test_a_resume_opens_the_run_that_waited_and_a_later_resume_reopens_the_same_one(
        tmp_path, mlflow_store, monkeypatch):
    """A federation that crashed before MLflow ever answered: ``RESUME=1`` opens its run
    (with the resume's tags); the next resume reads the run from ``tracking-run.json``
    instead of taking the federation's own id for an MLflow run id (which MLflow lacks)."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    down = FederationTracker("pe-seg", _closed_port_uri(), experiment="resume-start")
    federation = down.start("r", {"lr": 0.1}, {"flwr.run-id": "1"})
    folder = tmp_path / federation
    down.use_outbox(folder)
    assert down.run_id == "" and RunStart.load(folder).mlflow_run_id == ""

    store = mlflow_store(tmp_path / "mlflow")
    up = FederationTracker("pe-seg", store, str(tmp_path / "art"), experiment="resume-start")
    assert up.resume(federation, after_round=0, flwr_run_id="2", outbox_dir=folder) \
        == federation
    opened = RunStart.load(folder).mlflow_run_id
    assert up.run_id == opened and opened != federation
    mlflow.end_run()
    again = FederationTracker("pe-seg", store, experiment="resume-start")
    again.resume(federation, after_round=0, flwr_run_id="3", outbox_dir=folder)
    assert again.run_id == opened
    mlflow.end_run()
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("resume-start").experiment_id])
    assert run.info.run_id == opened and run.data.params == {"lr": "0.1"}
    assert run.data.tags["flwr.run-id"] == "3" and "resumed-after-round-0" in run.data.tags


def test_a_resume_sends_the_params_of_a_run_opened_just_before_a_crash(tmp_path, mlflow_store):
    """Found in review: ``RunStart.open`` saves the MLflow run id before it logs the params;
    a crash between the two left a resume that reopened the run and dropped the start, so
    the run never got its params."""
    store = mlflow_store(tmp_path / "mlflow")
    mlflow.set_tracking_uri(store)
    run = mlflow.start_run(experiment_id=mlflow.create_experiment("half-open"), run_name="r")
    mlflow.end_run()
    folder = tmp_path / "federation"
    RunStart("federation", "half-open", "", "r", {"lr": "0.1"}, {"flwr.run-id": "1"},
             mlflow_run_id=run.info.run_id, folder=folder).save()  # crashed: params unsent

    tracker = FederationTracker("pe-seg", store, experiment="half-open")
    tracker.resume("federation", after_round=0, flwr_run_id="2", outbox_dir=folder)
    mlflow.end_run()
    assert tracker.run_id == run.info.run_id
    reopened = MlflowClient(store).get_run(run.info.run_id)
    assert reopened.data.params == {"lr": "0.1"}
    assert reopened.data.tags["flwr.run-id"] == "2"
    assert RunStart.load(folder).params_sent
