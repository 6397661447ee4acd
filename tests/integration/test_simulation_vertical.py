"""End to end: the vertical federations in Flower's simulation engine (SuperLink, `flwr run`, Ray).

``python -m app.tooling.simulate`` (what ``make simulate KIND=vertical`` runs) with
``federation.kind = "vertical"``:

- pvFed over the three departments of Cleveland's heart-disease patients (a clinic, a
  stress-test lab, a catheter lab; each its own task): the private set intersection, then
  rounds of local encoders in and a global encoder out, every stage a ``train.vertical``
  message served by a fresh ClientApp in a Ray worker (what a site keeps between stages
  lives in its state dir);
- U-shaped split learning over three small synthetic chest X-ray hospitals: every batch's
  activations and gradients over Flower messages.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from app.tooling.daemon import spawn_daemon

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"
pytestmark = pytest.mark.integration

#: An upper bound only (each federation takes about a minute on 2 idle cores).
FEDERATION_TIMEOUT = 900
DEPARTMENTS = ("cath-lab", "clinic", "stress-lab")


def _simulate(tmp: Path, data_root: Path, tracking: str, run_config: list[str], name: str):
    command = [sys.executable, "-m", "app.tooling.simulate", "--data-root", str(data_root),
               "--sites", "3", "--tracking-uri", tracking,
               "--artifact-root", str(tmp / "artifacts"), "--flwr-home", str(tmp / "flwr-home"),
               "--log-dir", str(tmp / "logs"), "--timeout", str(FEDERATION_TIMEOUT - 60)]
    for item in ("min-nodes=3", "node-wait-timeout=60", "round-timeout=600",
                 "federation.kind=vertical", f"experiment={name}", *run_config):
        command += ["-c", item]
    process = spawn_daemon(command, {**os.environ, "PYTHONPATH": str(ROOT)},
                           tmp / "federation.log", f"simulate-{name}", cwd=ROOT)
    try:
        code = process.process.wait(timeout=FEDERATION_TIMEOUT)
        output = process.log_text()
        assert code == 0, output[-8000:]
    finally:
        process.stop()
    client = MlflowClient(tracking_uri=tracking)
    runs = client.search_runs([client.get_experiment_by_name(name).experiment_id])
    assert len(runs) == 1
    return output, client, runs[0]


def _history(client: MlflowClient, run_id: str, key: str) -> list[float]:
    return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


@pytest.mark.skipif(not (SHARED / "tabular" / "heart_disease").is_dir(),
                    reason="needs the shared data folder (../shared/data)")
def test_pvfed_in_the_simulation_engine(tmp_path, mlflow_store):
    data_root = tmp_path / "data"  # hospital-00..02: the clinic, the stress lab, the cath lab
    subprocess.run([sys.executable, "-m", "clients.datagen", "vertical", "--set", "heart-disease",
                    "--shared", str(SHARED), "--out", str(data_root), "--seed", "0"],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    output, client, run = _simulate(tmp_path, data_root, mlflow_store(tmp_path), [
        "task=tabular-cls", "num-server-rounds=2", "vertical.method=pvfed",
        "vertical.aggregation=pca", "vertical.local-epochs=5", "vertical.encoder-epochs=20",
        "vertical.global-epochs=20", "vertical.head-epochs=5"], "vertical-pvfed")
    assert "status: finished:completed" in output
    run_id = run.info.run_id
    assert run.info.status == "FINISHED" and run.data.params["vertical.method"] == "pvfed"
    assert _history(client, run_id, "vertical/psi-size") == [303.0]  # every patient shared
    for department in DEPARTMENTS:
        for metric in ("final-local-test-auc", "final-pvfed-test-auc"):
            values = _history(client, run_id, f"site/{department}/{metric}")
            assert len(values) == 1 and 0.0 <= values[0] <= 1.0
    assert _history(client, run_id, "traffic/uplink-bytes")[-1] > 0


def test_split_learning_in_the_simulation_engine(tmp_path, mlflow_store):
    data_root = tmp_path / "data"
    subprocess.run([sys.executable, "-m", "clients.datagen", "synthetic", "--task", "cxr-cls",
                    "--out", str(data_root), "--sites", "3", "--seed", "0",
                    "--image-size", "32"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    output, client, run = _simulate(tmp_path, data_root, mlflow_store(tmp_path), [
        "task=cxr-cls", "image-size=32", "batch-size=4", "model-size=small",
        "num-server-rounds=2", "local-steps=4", "vertical.method=splitnn-u",
        "vertical.batches-per-message=2"], "vertical-split")
    assert "status: finished:completed" in output
    run_id = run.info.run_id
    assert run.info.status == "FINISHED" and run.data.params["vertical.method"] == "splitnn-u"
    for site in ("hospital-00", "hospital-01", "hospital-02"):
        values = _history(client, run_id, f"site/{site}/final-test-auc")
        assert len(values) == 1 and 0.0 <= values[0] <= 1.0
    up = _history(client, run_id, "traffic/uplink-bytes")
    assert up[-1] > up[0] > 0  # activations and gradients cross every round
