"""A SecAgg+ federation through the in-process engine: the real ServerApp and ClientApp.

Four small synthetic hospitals; one drops out of every round after its masked input was
sent (silent at the unmask stage), so the coordinator rebuilds that site's self mask from
its neighbours' shares and still sums its input. What the coordinator keeps and tracks
(reports, the checkpoint, MLflow metrics) holds the sum only: no per-site residual norm,
no site vector.
"""

from __future__ import annotations

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from app.engine import SiteFaults, partition_sites, run_federation
from strategies.wire import message_keys as keys
from tests.integration.conftest import write_small_hospitals

SITES = ("hospital-00", "hospital-01", "hospital-02", "hospital-03")
GONE = "hospital-03"


@pytest.fixture(scope="module")
def federation(tmp_path_factory, mlflow_store):
    tmp = tmp_path_factory.mktemp("engine-secagg")
    write_small_hospitals(tmp / "data", seed=5, num_sites=len(SITES))
    store = mlflow_store(tmp / "mlflow")
    sites = partition_sites(len(SITES), {SITES.index(GONE): SiteFaults(silent_stages=("unmask",))})
    outcome = run_federation({
        "num-server-rounds": 2, "local-steps": 2, "image-size": 32, "batch-size": 4,
        "min-nodes": len(SITES), "node-wait-timeout": 5, "experiment": "engine-secagg",
        "data-root": str(tmp / "data"), "tracking-uri": store,
        "artifact-root": str(tmp / "artifacts"), "checkpoint-dir": str(tmp / "checkpoints"),
        "final-evaluation": False, "cross-site.finetune-steps": 0,
        "round.deadline": 2.0, "round.quorum": len(SITES) - 1,
        "strategy.secure-aggregation": "secagg+", "strategy.defence": "none",
        "strategy.codec": "randk:0.5"}, sites, run_id=4343)
    return tmp, store, outcome


def test_every_round_sums_all_four_inputs_though_one_site_left_at_unmask(federation):
    _, _, outcome = federation
    assert sorted(outcome.reports) == [1, 2]
    for report in outcome.reports.values():
        assert not report.aggregation_failed
        assert report.strategy["secagg-summed"] == 4 and report.strategy["secagg-dropped"] == 0
        assert sorted(report.train) == list(SITES)
        assert report.train_dropped == {GONE: report.train_dropped[GONE]}
        assert report.train_dropped[GONE].startswith("secagg unmask: ")
        assert all(keys.RESIDUAL_NORM not in m for m in report.train.values())
        assert sorted(report.evaluate) == list(SITES)
        assert report.strategy["uplink-ratio"] > 1.0  # rand-k 0.5 in ceil(log2 m) bits


def test_mlflow_tracks_the_sum_and_no_site_residual(federation):
    _, store, outcome = federation
    client = MlflowClient(store)
    run = client.get_run(outcome.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["strategy.secure-aggregation"] == "secagg+"
    assert [m.value for m in client.get_metric_history(run.info.run_id,
                                                       "strategy/secagg-summed")] == [4.0, 4.0]
    assert not [name for name in run.data.metrics if keys.RESIDUAL_NORM in name]


def test_the_checkpoint_holds_the_global_models_only(federation):
    tmp, _, outcome = federation
    path = tmp / "checkpoints" / outcome.mlflow_run_id / "server-checkpoint.npz"
    with np.load(path, allow_pickle=False) as saved:
        names = set(saved.files)
        models = {n for n in names if n.startswith(("model-", "best-"))}
        assert names - models == {"meta"}  # the strategy's state: JSON, no array of a site
        assert len(models) == 2 * len(outcome.arrays)
