"""A whole federation through the in-process engine: the real ServerApp and ClientApp on two
small synthetic hospitals (real DICOM series and NIfTI masks), no SuperLink, no Ray."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from app.engine import partition_sites, run_federation
from tests.integration.conftest import write_small_hospitals

SITES = ("hospital-00", "hospital-01")
RUN_ID = 4242


@pytest.fixture(scope="module")
def federation(tmp_path_factory, mlflow_store):
    tmp = tmp_path_factory.mktemp("engine")
    write_small_hospitals(tmp / "data", seed=5)
    store = mlflow_store(tmp / "mlflow")
    sites = partition_sites(2)
    outcome = run_federation({
        "num-server-rounds": 2, "local-steps": 2, "image-size": 32, "batch-size": 4,
        "node-wait-timeout": 5, "experiment": "engine", "data-root": str(tmp / "data"),
        "tracking-uri": store, "artifact-root": str(tmp / "artifacts"),
        "checkpoint-dir": str(tmp / "checkpoints"), "cross-site.finetune-steps": 1,
        "strategy.codec": "topk:0.1"}, sites, run_id=RUN_ID)
    return tmp, store, sites, outcome


def test_every_round_trains_and_evaluates_every_site(federation):
    _, _, _, outcome = federation
    assert sorted(outcome.reports) == [1, 2]
    for report in outcome.reports.values():
        assert sorted(report.train) == list(SITES) and not report.train_dropped
        assert sorted(report.evaluate) == list(SITES) and not report.evaluate_dropped
        assert all(m["steps"] == 2 for m in report.train.values())
    assert outcome.best_round in (1, 2)
    assert outcome.cross_site is not None and outcome.cross_site.rows == [
        "global", "hospital-00-finetuned", "hospital-01-finetuned"]


def test_mlflow_holds_the_run_its_rounds_and_models(federation):
    _, store, _, outcome = federation
    client = MlflowClient(store)
    run = client.get_run(outcome.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["flwr.run-id"] == str(RUN_ID)
    assert run.data.params["local-steps"] == "2" and run.data.params["strategy.codec"] == "topk:0.1"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "eval/val-dice")) \
        == [1, 2]
    assert "test/dice" in run.data.metrics
    assert outcome.models.best_uri and outcome.models.final_uri


def test_each_site_kept_its_state_and_the_server_its_checkpoint(federation):
    tmp, _, sites, outcome = federation
    # error feedback: the residual of the compressed update is kept on the site's disk,
    # under the federation's MLflow run id; each site ran in its own Context
    for site, name in zip(sites, SITES):
        assert (tmp / "data" / name / ".fedmed-state" / outcome.mlflow_run_id).is_dir()
        assert site.context.node_config["partition-id"] == SITES.index(name)
    assert (tmp / "checkpoints" / outcome.mlflow_run_id / "server-checkpoint.npz").is_file()
