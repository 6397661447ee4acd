"""pvFed through the product: the ServerApp, the real ClientApp, Flower messages, MLflow.

Three departments of one synthetic hospital, each a ``tabular-cls`` site folder of its
own variables and its own label, hold overlapping patients: the in-process engine runs
the PSI, pvFed's local stage and its rounds, every stage a ``train.vertical`` message.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from app.engine import VirtualSite, run_federation

pytestmark = pytest.mark.usefixtures("server_identity", "one_torch_thread")

PATIENTS = 90
#: Department -> (its patients, how strongly its features show the shared latent state).
DEPARTMENTS = {"clinic": (range(0, 84), 0.2), "stress-lab": (range(4, 90), 1.5),
               "cath-lab": (range(2, 88), 1.0)}


def write_department(folder: Path, name: str, patients: range, signal: float) -> Path:
    """``table.csv`` of 3 feature columns (one missing cell) and ``vertical-site.toml``."""
    latent = np.random.default_rng(0).normal(size=PATIENTS)
    rng = np.random.default_rng(len(name))
    split = np.array(["train"] * 54 + ["val"] * 18 + ["test"] * 18)[np.random.default_rng(1)
                                                                     .permutation(PATIENTS)]
    folder.mkdir(parents=True)
    lines = ["patient_id,split,label,a,b,c"]
    for i in patients:
        x = signal * latent[i] + rng.normal(size=3)
        label = int(latent[i] + 0.5 * rng.normal() > 0)
        cells = ["" if (i, name) == (10, "clinic") else f"{v:.4f}" for v in x]
        lines.append(",".join([f"pt-{i:03d}", split[i], str(label), *cells]))
    (folder / "table.csv").write_text("\n".join(lines) + "\n")
    (folder / "vertical-site.toml").write_text(f'task = "tabular-cls"\ndepartment = "{name}"\n')
    return folder


def test_pvfed_runs_over_flower_messages_and_tracks_every_site(tmp_path, mlflow_store):
    sites = [VirtualSite.folder(write_department(tmp_path / name, name, patients, signal),
                                site_name=f"hospital-{name}", state_dir=tmp_path / f"state-{name}")
             for name, (patients, signal) in DEPARTMENTS.items()]
    store = mlflow_store(tmp_path / "mlflow")
    outcome = run_federation({
        "federation.kind": "vertical", "vertical.method": "pvfed", "task": "tabular-cls",
        "vertical.aggregation": "pca", "vertical.dim": 4, "vertical.local-epochs": 10,
        "vertical.encoder-epochs": 60, "vertical.global-epochs": 60, "vertical.head-epochs": 10,
        "num-server-rounds": 2, "batch-size": 16, "min-nodes": 3, "node-wait-timeout": 10,
        "experiment": "pvfed-engine", "tracking-uri": store,
        "artifact-root": str(tmp_path / "artifacts")}, sites)
    assert outcome.intersection == 80  # patients 4..83
    metrics = outcome.result.site_metrics
    assert sorted(metrics) == sorted(DEPARTMENTS)
    for values in metrics.values():
        assert 0.0 <= values["pvfed-test-auc"] <= 1.0 and 0.0 <= values["local-test-auc"] <= 1.0
        assert values["head-inputs"] == 4 + 32  # global vector + the MLP's 32 features
    by_stage = outcome.traffic.by_stage
    assert by_stage["pvfed-local"]["messages"] == 3 and by_stage["pvfed-round"]["messages"] == 6
    client = MlflowClient(tracking_uri=store)
    run = client.get_run(outcome.mlflow_run_id)
    history = client.get_metric_history(run.info.run_id, "site/clinic/pvfed-test-auc")
    assert sorted(m.step for m in history) == [1, 2]
    assert "vertical/pvfed-test-auc" in run.data.metrics
