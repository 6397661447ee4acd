"""End to end: adaptive structured pruning (PruneFL) in Flower's simulation engine (a real SuperLink,
`flwr run`, Ray).

``python -m app.tooling.simulate`` (what ``make simulate`` runs) with ``strategy.pruning =
"prunefl"`` in structured mode over two synthetic hospitals: the coordinator prunes the U-Net's
channels before round 1, each site trains the network without them (torch-pruning's surgery)
and sends only the kept weights, round 2 re-prunes from the sites' squared gradients, and the
registered model records its sparsity and runs through ``make predict``'s command without its
pruned channels.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from app.model_source import load_logged_model
from app.tracking.model_sparsity import runnable_network
from tests.integration.simulation_run import simulated_federation

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration

RUN_CONFIG = (
    "num-server-rounds=2", "local-steps=2", "image-size=32", "batch-size=4", "min-nodes=2",
    "node-wait-timeout=60", "experiment=pruning", "round-timeout=1200",
    "final-evaluation=false", "strategy.pruning=prunefl", "pruning.mode=structured",
    "pruning.initial-density=0.5", "pruning.interval=2",
)


@pytest.fixture(scope="module")
def pruned_federation(tmp_path_factory, small_hospitals, mlflow_store):
    tmp = tmp_path_factory.mktemp("simulation-pruning")
    data_root = tmp / "data"
    small_hospitals(data_root, 11)
    tracking = mlflow_store(tmp)
    with simulated_federation(tmp, data_root, 2, RUN_CONFIG, "pruning", tracking) as (client, run):
        yield tmp, data_root, tracking, client, run


def test_every_round_trains_a_pruned_model_and_round_two_re_prunes(pruned_federation):
    _, _, _, client, run = pruned_federation
    run_id = run.info.run_id
    density = [m.value for m in client.get_metric_history(run_id, "strategy/pruning-density")]
    assert len(density) == 2 and all(0 < d < 0.6 for d in density)
    objective = client.get_metric_history(run_id, "strategy/pruning-objective")
    assert [m.step for m in objective] == [2]  # PruneFL's criterion ran at round 2
    for site in ("hospital-00", "hospital-01"):
        versions = client.get_metric_history(run_id, f"site/{site}/pruning-version")
        assert [m.value for m in versions][:1] == [1.0], site


def test_the_registered_model_is_the_pruned_one_and_predict_runs_it_smaller(pruned_federation):
    tmp, data_root, tracking, client, run = pruned_federation
    assert run.data.metrics["model/params-kept"] < run.data.metrics["model/params-total"]
    assert run.data.metrics["model/flops"] < run.data.metrics["model/flops-dense"]
    logged = load_logged_model_from(tracking, "models:/pruning-final/1")
    assert logged.pruning == "structured"
    small = runnable_network(logged.model, torch.zeros(2, 9, 32, 32), logged.pruning)
    assert sum(p.numel() for p in small.parameters()) < sum(
        p.numel() for p in logged.model.parameters())
    with torch.no_grad():  # the same function without the zero channels
        x = torch.randn(2, 9, 32, 32)
        torch.testing.assert_close(small(x), logged.model(x), atol=1e-4, rtol=1e-4)
    result = subprocess.run(
        [sys.executable, "-m", "app.predict", "--model", "models:/pruning-final/1",
         "--data", str(data_root / "hospital-00"), "--out", str(tmp / "predictions"),
         "--split", "test", "--tracking-uri", tracking],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "runs without its pruned channels" in result.stderr


def load_logged_model_from(tracking: str, uri: str):
    """:func:`load_logged_model` against the federation's store."""
    import mlflow

    mlflow.set_tracking_uri(tracking)
    return load_logged_model(uri)
