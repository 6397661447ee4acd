"""End to end: real SuperLink, real `flwr run`, real DICOM/NIfTI sites, real MLflow store.

One federation, run with ``python -m app.processes.simulate`` (what
``make simulate`` runs) in a subprocess with its own FLWR_HOME, data and sqlite
MLflow store, is checked by every test of this module: two rounds on four
sites, the third with a broken manifest and the fourth under a site policy that
refuses to train with batches of 4 (its own ``min-batch-size = 16``; it still
evaluates): FedNova with heavy-ball SGD, AdaComm (tau clamped to 2, so every
site runs 2 steps), top-5% compressed uplink with error feedback, deadline and
quorum, a server checkpoint after each round. The deadline (60 s) is far above a
healthy round, so no reply is ever late: with 5 s, on a slow CI machine the
refusing site's reply, queued behind two trainings on the two Ray workers, once
missed it and was recorded as "no reply" instead of a refusal.

Resuming from the checkpoint (``resume=true``, ``make simulate RESUME=1``) runs
the same ServerApp code as a deployment's resume, which
``tests/integration/test_deployment_faults.py`` checks after killing the
SuperLink (same MLflow run, rounds continued, the model trained on); a second
simulation here to repeat it cost CI about 3 minutes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from clients.site.policy import SitePolicy, load_policy

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration

SITES = ("hospital-00", "hospital-01")
BROKEN = "hospital-02"
STRICT = "hospital-03"  # a copy of hospital-01 whose policy refuses batches of 4
RUN_CONFIG = (
    "local-steps=2", "image-size=32", "batch-size=4", "min-nodes=4", "node-wait-timeout=60",
    "experiment=e2e", "strategy.aggregator=fednova", "optimizer=sgd", "lr=0.05",
    "momentum=0.5", "strategy.schedule=adacomm", "adacomm.tau-min=2", "adacomm.tau-max=2",
    "round.deadline=60", "round.quorum=2", "strategy.codec=topk:0.05",
)


@dataclass(frozen=True)
class Federation:
    """The ``app.processes.simulate`` run of this module and where it wrote."""

    tmp: Path
    data_root: Path
    first: subprocess.CompletedProcess

    @property
    def checkpoints(self) -> Path:
        return self.tmp / "checkpoints"

    def mlflow(self) -> tuple[MlflowClient, object]:
        """Client and the one MLflow run of the federation's store."""
        uri = f"sqlite:///{self.tmp / 'mlflow.db'}"
        mlflow.set_tracking_uri(uri)
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name("e2e")
        runs = client.search_runs([experiment.experiment_id])
        assert len(runs) == 1
        return client, runs[0]


def _simulate(tmp: Path, data_root: Path, sites: int, rounds: int,
              extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "app.processes.simulate",
        "--data-root", str(data_root), "--sites", str(sites),
        "--tracking-uri", f"sqlite:///{tmp / 'mlflow.db'}",
        "--artifact-root", str(tmp / "artifacts"),
        "--flwr-home", str(tmp / "flwr-home"), "--log-dir", str(tmp / "logs"),
        "--timeout", "540", "-c", f"num-server-rounds={rounds}",
    ]
    for item in (*RUN_CONFIG, *extra):
        command += ["-c", item]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=600, check=False)
    if result.returncode != 0:
        print(result.stdout[-8000:], result.stderr[-4000:])
    return result


@pytest.fixture(scope="module")
def federation(tmp_path_factory, small_hospitals, mlflow_store) -> Federation:
    tmp = tmp_path_factory.mktemp("simulation")
    mlflow_store(tmp)  # tmp/mlflow.db: a migrated empty store (tests/conftest.py)
    data_root = tmp / "data"
    small_hospitals(data_root, 3)
    broken = data_root / BROKEN
    broken.mkdir()
    (broken / "manifest.csv").write_text("this,is,not\na,manifest,file\n")
    shutil.copytree(data_root / SITES[1], data_root / STRICT)
    policies = tmp / "policies"  # one file per hospital; no file: the permissive policy
    policies.mkdir()
    (policies / f"{STRICT}.toml").write_text("min-batch-size = 16\n")
    extra = (f"checkpoint-dir={tmp / 'checkpoints'}", f"site-policy={policies}")
    first = _simulate(tmp, data_root, sites=4, rounds=2, extra=extra)
    assert first.returncode == 0, first.stderr[-2000:]
    return Federation(tmp, data_root, first)


def _steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def test_run_completes_and_is_tracked_per_round_and_site(federation):
    result = federation.first
    assert "status: finished:completed" in result.stdout
    assert "bytes on the wire over 2 rounds" in result.stdout
    assert "Federation summary" in result.stdout
    assert "held-out test dice: " in result.stdout
    assert "apply it at a site: make predict MODEL=models:/e2e-best/1 " in result.stdout
    assert any(federation.checkpoints.glob("*/server-checkpoint.npz"))  # what RESUME=1 reads

    client, run = federation.mlflow()
    run_id = run.info.run_id
    assert run.info.status == "FINISHED"
    assert run.data.params["num-server-rounds"] == "2"
    assert run.data.params["local-steps"] == "2"
    assert run.data.params["strategy.aggregator"] == "fednova"
    for key in ("eval/val-dice", "train/train-loss", "round-seconds"):
        assert _steps(client, run_id, key) == [1, 2], key
    for site in SITES:
        for key in ("val-dice", "train-loss", "steps"):
            assert _steps(client, run_id, f"site/{site}/{key}") == [1, 2]
        steps = client.get_metric_history(run_id, f"site/{site}/steps")
        assert all(m.value == 2 for m in steps)
    dice = client.get_metric_history(run_id, "eval/val-dice")
    assert all(0.0 <= m.value <= 1.0 for m in dice)

    models = {m.name: m for m in client.search_logged_models(
        experiment_ids=[run.info.experiment_id])}
    assert sorted(models) == ["best-model", "global-model"]
    assert {m.source_run_id for m in models.values()} == {run_id}
    # Nothing left running: no process of this federation (they all name its log dir).
    processes = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(federation.tmp / "logs") not in processes


def test_uplink_is_compressed_with_error_feedback_kept_at_the_site(federation):
    client, run = federation.mlflow()
    run_id = run.info.run_id
    # Compressed uplink: top-5% payloads, measured as serialised bytes.
    for site in SITES:
        up = client.get_metric_history(run_id, f"site/{site}/bytes-up")
        ratio = client.get_metric_history(run_id, f"site/{site}/uplink-ratio")
        assert len(up) == 2 and all(m.value > 0 for m in up)
        assert all(m.value > 8 for m in ratio)  # ~20x less than dense fp32 for top-5%
        assert _steps(client, run_id, f"site/{site}/residual-norm") == [1, 2]
        residual = federation.data_root / site / ".fedmed-state" / run_id / "ef-residual.npy"
        assert residual.exists()


def test_fednova_adacomm_quorum_round_survives_a_failing_site(federation):
    """FedNova + AdaComm + deadline/quorum, with a broken site and a refusing one."""
    client, run = federation.mlflow()
    run_id = run.info.run_id
    assert [m.value for m in client.get_metric_history(run_id, "replies-dropped")] == [2.0, 2.0]
    assert [m.value for m in client.get_metric_history(run_id, "replies-accepted")] == [2.0, 2.0]
    # tau_eff = sum_i p_i ||a_i||_1 with heavy-ball 0.5 over 2 steps: 1 + 1.5 = 2.5
    tau_eff = client.get_metric_history(run_id, "strategy/tau-eff")
    assert [m.step for m in sorted(tau_eff, key=lambda m: m.step)] == [1, 2]
    assert all(m.value == pytest.approx(2.5) for m in tau_eff)
    assert _steps(client, run_id, "strategy/schedule-tau") == [1, 2]
    assert _steps(client, run_id, "strategy/global-loss") == [1, 2]
    local = client.download_artifacts(run_id, "rounds/round-001-dropped.json",
                                      str(federation.tmp))
    dropped = json.loads(Path(local).read_text())
    reasons = " ".join(dropped.values())
    assert f"site {BROKEN}: ManifestError" in reasons
    assert str(federation.data_root) not in reasons  # no site path leaves the site


def test_a_site_policy_violation_is_refused_and_the_round_goes_on(federation):
    """The strict site refuses to train (rule named, no path) and reports its policy."""
    assert (f"{STRICT}: site reported an error: site {STRICT}: policy rule "
            "min-batch-size (refused)") in federation.first.stdout  # the progress line
    client, run = federation.mlflow()
    run_id = run.info.run_id
    assert [m.value for m in client.get_metric_history(run_id, f"site/{STRICT}/refused")] \
        == [1.0, 1.0]
    assert _steps(client, run_id, f"site/{STRICT}/train-loss") == []
    assert _steps(client, run_id, f"site/{STRICT}/val-dice") == [1, 2]  # it still evaluates
    assert run.data.params[f"site/{SITES[0]}/policy"] == SitePolicy.permissive().fingerprint
    assert (run.data.params[f"site/{STRICT}/policy"]
            == load_policy(federation.tmp / "policies" / f"{STRICT}.toml").fingerprint)
    local = client.download_artifacts(run_id, "rounds/round-001-dropped.json",
                                      str(federation.tmp))
    reason = json.loads(Path(local).read_text())[f"train/{STRICT}"]
    assert "policy rule min-batch-size" in reason
    assert "/" not in reason  # no path leaves the site


def test_the_models_are_registered_and_take_any_batch_size(federation):
    """Best round by the same round's val-dice, registered; a batch of 4 through both flavours."""
    client, run = federation.mlflow()
    run_id = run.info.run_id
    dice = {m.step: m.value for m in client.get_metric_history(run_id, "eval/val-dice")}
    best_round = max(dice, key=lambda r: (dice[r], -r))
    assert run.data.tags["best-round"] == str(best_round)
    for name, round_ in (("e2e-best", best_round), ("e2e-final", 2)):
        versions = client.search_model_versions(f"name='{name}'")
        assert len(versions) == 1, name
        tags = versions[0].tags
        assert tags["run-id"] == run_id and tags["round"] == str(round_), (name, tags)
        assert tags["codec"] == "topk:0.05"
        model = mlflow.pytorch.load_model(f"models:/{name}/1")
        model.eval()
        out = model(torch.zeros(4, 9, 32, 32))
        assert tuple(out.shape) == (4, 1, 32, 32) and torch.isfinite(out).all()
    predicted = mlflow.pyfunc.load_model("models:/e2e-best/1").predict(
        np.zeros((4, 9, 32, 32), np.float32))
    assert np.asarray(predicted).shape[0] == 4


def test_the_selected_model_is_tested_at_every_site_with_a_cross_site_matrix(federation):
    """Held-out test split per site at the end, and global + fine-tuned models on every site."""
    client, run = federation.mlflow()
    run_id = run.info.run_id
    for site in SITES:
        history = client.get_metric_history(run_id, f"site/{site}/test-dice")
        assert len(history) == 1 and 0.0 <= history[0].value <= 1.0, site
    assert len(client.get_metric_history(run_id, "test/dice")) == 1
    artifacts = {a.path for folder in ("cross-site", "figures")
                 for a in client.list_artifacts(run_id, folder)}
    assert {"cross-site/matrix.json", "cross-site/matrix.png", "figures/validation.png",
            "figures/bytes.png", "figures/tau.png"} <= artifacts, artifacts
    local = client.download_artifacts(run_id, "cross-site/matrix.json", str(federation.tmp))
    table = json.loads(Path(local).read_text())
    rows = [row[0] for row in table["data"]]
    assert rows[0] == "global" and {f"{s}-finetuned" for s in SITES} <= set(rows), rows
    for site in SITES:
        assert site in table["columns"]
