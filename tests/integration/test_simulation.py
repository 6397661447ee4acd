"""End to end: real SuperLink, real `flwr run`, real DICOM/NIfTI sites, real MLflow store.

Each test runs ``python -m app.simulate`` (what ``make simulate`` runs) in a
subprocess with its own FLWR_HOME, data and sqlite MLflow store, then reads the
results back from MLflow.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from clients.synthetic_ct import generate_federation

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def _simulate(tmp: Path, data_root: Path, sites: int, rounds: int,
              extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    tracking = f"sqlite:///{tmp / 'mlflow.db'}"
    command = [
        sys.executable, "-m", "app.simulate",
        "--data-root", str(data_root), "--sites", str(sites),
        "--tracking-uri", tracking, "--artifact-root", str(tmp / "artifacts"),
        "--flwr-home", str(tmp / "flwr-home"), "--log-dir", str(tmp / "logs"),
        "--timeout", "540",
        "-c", f"num-server-rounds={rounds}", "-c", "local-steps=2", "-c", "image-size=32",
        "-c", "batch-size=4", "-c", f"min-nodes={sites}", "-c", "node-wait-timeout=60",
        "-c", "experiment=e2e",
    ]
    for item in extra:
        command += ["-c", item]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=600, check=False)
    if result.returncode != 0:
        print(result.stdout[-8000:], result.stderr[-4000:])
    return result


def _mlflow_run(tmp: Path):
    mlflow.set_tracking_uri(f"sqlite:///{tmp / 'mlflow.db'}")
    client = MlflowClient()
    experiment = client.get_experiment_by_name("e2e")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    return client, runs[0]


def _steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


@pytest.fixture(scope="module")
def two_hospitals(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hospitals")
    generate_federation(root, num_sites=2, seed=3, image_size=32)
    return root


def test_two_sites_two_rounds_tracked_in_mlflow(tmp_path, two_hospitals):
    result = _simulate(tmp_path, two_hospitals, sites=2, rounds=2,
                       extra=("strategy.codec=topk:0.05",))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "status: finished:completed" in result.stdout
    assert "bytes on the wire over 2 rounds" in result.stdout
    assert "Federation summary" in result.stdout

    client, run = _mlflow_run(tmp_path)
    run_id = run.info.run_id
    assert run.info.status == "FINISHED"
    assert run.data.params["num-server-rounds"] == "2"
    assert run.data.params["local-steps"] == "2"
    for key in ("eval/val-dice", "train/train-loss", "round-seconds"):
        assert _steps(client, run_id, key) == [1, 2], key
    for site in ("hospital-00", "hospital-01"):
        for key in ("val-dice", "train-loss", "steps"):
            assert _steps(client, run_id, f"site/{site}/{key}") == [1, 2]
    dice = client.get_metric_history(run_id, "eval/val-dice")
    assert all(0.0 <= m.value <= 1.0 for m in dice)
    steps = client.get_metric_history(run_id, f"site/hospital-00/steps")
    assert all(m.value == 2 for m in steps)
    # Compressed uplink: top-5% payloads, measured as serialised bytes.
    for site in ("hospital-00", "hospital-01"):
        up = client.get_metric_history(run_id, f"site/{site}/bytes-up")
        ratio = client.get_metric_history(run_id, f"site/{site}/uplink-ratio")
        assert len(up) == 2 and all(m.value > 0 for m in up)
        assert all(m.value > 8 for m in ratio)  # ~20x less than dense fp32 for top-5%
        assert [m.step for m in client.get_metric_history(
            run_id, f"site/{site}/residual-norm")] == [1, 2]
        residual = two_hospitals / site / ".fedmed-state" / run_id / "ef-residual.npy"
        assert residual.exists()

    models = client.search_logged_models(experiment_ids=[run.info.experiment_id])
    assert [m.source_run_id for m in models] == [run_id]
    model = mlflow.pytorch.load_model(models[0].model_uri)
    out = model(torch.zeros(1, 9, 32, 32))
    assert tuple(out.shape) == (1, 1, 32, 32)
    assert np.isfinite(out.detach().numpy()).all()
    # Nothing left running: no process of this federation (they all name its log dir).
    processes = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path / "logs") not in processes


def test_fednova_adacomm_quorum_round_survives_a_failing_site(tmp_path, two_hospitals):
    """FedNova + AdaComm + deadline/quorum, with a third site whose data is broken."""
    data_root = tmp_path / "data"
    shutil.copytree(two_hospitals, data_root)
    broken = data_root / "hospital-02"
    broken.mkdir()
    (broken / "manifest.csv").write_text("this,is,not\na,manifest,file\n")
    result = _simulate(tmp_path, data_root, sites=3, rounds=2, extra=(
        "strategy.aggregator=fednova", "optimizer=sgd", "lr=0.05", "momentum=0.5",
        "strategy.schedule=adacomm", "round.deadline=5", "round.quorum=2"))
    assert result.returncode == 0, result.stderr[-2000:]

    client, run = _mlflow_run(tmp_path)
    run_id = run.info.run_id
    assert [m.value for m in client.get_metric_history(run_id, "replies-dropped")] == [1.0, 1.0]
    assert [m.value for m in client.get_metric_history(run_id, "replies-accepted")] == [2.0, 2.0]
    assert _steps(client, run_id, "eval/val-dice") == [1, 2]
    assert run.data.params["strategy.aggregator"] == "fednova"
    # tau_eff = sum_i p_i ||a_i||_1 with heavy-ball 0.5 over 2 steps: 1 + 1.5 = 2.5
    tau_eff = client.get_metric_history(run_id, "strategy/tau-eff")
    assert [m.step for m in tau_eff] == [1, 2]
    assert tau_eff[0].value == pytest.approx(2.5)
    assert _steps(client, run_id, "strategy/schedule-tau") == [1, 2]
    assert _steps(client, run_id, "strategy/global-loss") == [1, 2]
    local = client.download_artifacts(run_id, "rounds/round-001-dropped.json", str(tmp_path))
    dropped = json.loads(Path(local).read_text())
    reasons = " ".join(dropped.values())
    assert "site hospital-02: ManifestError" in reasons
    assert str(data_root) not in reasons  # no site path leaves the site


def test_resume_from_the_server_checkpoint_continues_the_same_mlflow_run(tmp_path,
                                                                        two_hospitals):
    checkpoints = tmp_path / "checkpoints"
    first = _simulate(tmp_path, two_hospitals, sites=2, rounds=1, extra=(
        f"checkpoint-dir={checkpoints}", "strategy.schedule=adacomm"))
    assert first.returncode == 0, first.stderr[-2000:]
    assert (checkpoints / "server-checkpoint.pkl").exists()
    resumed = _simulate(tmp_path, two_hospitals, sites=2, rounds=3, extra=(
        f"checkpoint-dir={checkpoints}", "strategy.schedule=adacomm", "resume=true"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "Resuming after round 1" in resumed.stdout

    client, run = _mlflow_run(tmp_path)   # one MLflow run for the whole federation
    run_id = run.info.run_id
    assert _steps(client, run_id, "eval/val-dice") == [1, 2, 3]
    assert _steps(client, run_id, "strategy/schedule-tau") == [1, 2, 3]
    assert any(tag.startswith("resumed-after-round-1") for tag in run.data.tags)
