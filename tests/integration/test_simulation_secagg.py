"""End to end: SecAgg+ in Flower's simulation engine (a real SuperLink, `flwr run`, Ray).

``python -m app.tooling.simulate`` (what ``make simulate`` runs) with
``strategy.secure-aggregation = "secagg+"`` and DP-SGD over four synthetic
hospitals, one of which allows its data almost no privacy budget
(``[dp] max-epsilon = 0.001``): it answers the setup and share-keys stages and is
refused by its own ledger at the collect stage, before anything trains. It drops out
in the middle of every round after its neighbours agreed masks with it, so the
coordinator must rebuild its mask key from their shares to unmask the sum of the
other three. Every stage is a Flower ``train`` message served by a fresh ClientApp
in a Ray worker: what a site keeps between stages lives in its state dir. The server
optimizer is FedYogi (``strategy.server-opt = "yogi"``): it acts on the unmasked sum, and
its moments are in the coordinator's checkpoint.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from app.tooling import secagg_keys
from app.tooling.daemon import spawn_daemon
from clients.site.secure_identity import SIMULATION_PKI
from strategies.rounds.checkpoint import CHECKPOINT_FILE, load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration

DROPPING = "hospital-03"
SITES = ("hospital-00", "hospital-01", "hospital-02")
ROUNDS = 2
RUN_CONFIG = (
    f"num-server-rounds={ROUNDS}", "local-steps=2", "image-size=32", "batch-size=4",
    "min-nodes=4", "node-wait-timeout=60", "experiment=secagg", "round-timeout=1200",
    "strategy.secure-aggregation=secagg+", "strategy.defence=none", "final-evaluation=false",
    "privacy.noise-multiplier=1.0", "privacy.max-grad-norm=1.0", "strategy.server-opt=yogi",
)
#: An upper bound only (a healthy run takes ~1.5 min on 2 idle cores).
FEDERATION_TIMEOUT = 1500


@pytest.fixture(scope="module")
def secure_federation(tmp_path_factory, small_hospitals, mlflow_store):
    tmp = tmp_path_factory.mktemp("simulation-secagg")
    data_root = tmp / "data"
    small_hospitals(data_root, 5)
    shutil.copytree(data_root / "hospital-00", data_root / SITES[2])
    shutil.copytree(data_root / "hospital-01", data_root / DROPPING)
    policies = tmp / "policies"  # no file: the permissive policy
    policies.mkdir()
    # its policy file names its SecAgg+ signing key and the roster (the simulated sites
    # without a file add themselves to that roster: clients/site/secure_identity.py)
    pki = data_root / SIMULATION_PKI
    key, roster = pki / f"{DROPPING}.key", pki / "roster.json"
    with contextlib.redirect_stdout(io.StringIO()) as public:
        assert secagg_keys.main(["keygen", "--site", DROPPING, "--out", str(key)]) == 0
    assert secagg_keys.main(["add", "--roster", str(roster), "--site", DROPPING,
                             "--public", public.getvalue().split()[-1]]) == 0
    (policies / f"{DROPPING}.toml").write_text(
        f'[dp]\nmax-epsilon = 0.001\n[secure-aggregation]\nroster = "{roster}"\n'
        f'signing-key = "{key}"\n')
    tracking = mlflow_store(tmp)
    command = [sys.executable, "-m", "app.tooling.simulate", "--data-root", str(data_root),
               "--sites", "4", "--tracking-uri", tracking,
               "--artifact-root", str(tmp / "artifacts"), "--flwr-home", str(tmp / "flwr-home"),
               "--log-dir", str(tmp / "logs"), "--timeout", str(FEDERATION_TIMEOUT - 60)]
    for item in (*RUN_CONFIG, f"site-policy={policies}", f"checkpoint-dir={tmp / 'checkpoints'}"):
        command += ["-c", item]
    process = spawn_daemon(command, {**os.environ, "PYTHONPATH": str(ROOT)},
                           tmp / "federation.log", "simulate-secagg", cwd=ROOT)
    try:
        code = process.process.wait(timeout=FEDERATION_TIMEOUT)
        assert code == 0, process.log_text()[-8000:]
        client = MlflowClient(tracking_uri=tracking)
        runs = client.search_runs([client.get_experiment_by_name("secagg").experiment_id])
        assert len(runs) == 1
        yield tmp, data_root, process.log_text(), client, runs[0]
    finally:
        process.stop()


def _values(client: MlflowClient, run_id: str, key: str) -> list[float]:
    return [m.value for m in sorted(client.get_metric_history(run_id, key),
                                    key=lambda m: m.step)]


def test_a_secure_round_survives_a_site_dropping_mid_round(secure_federation):
    tmp, data_root, output, client, run = secure_federation
    run_id = run.info.run_id
    assert "status: finished:completed" in output
    assert run.info.status == "FINISHED"
    assert run.data.params["strategy.secure-aggregation"] == "secagg+"
    # Every round: three inputs summed, the dropped site's pairwise masks removed.
    assert _values(client, run_id, "strategy/secagg-summed") == [3.0] * ROUNDS
    assert _values(client, run_id, "strategy/secagg-dropped") == [1.0] * ROUNDS
    assert len(_values(client, run_id, "eval/val-dice")) == ROUNDS
    local = client.download_artifacts(run_id, "rounds/round-001-dropped.json", str(tmp))
    reason = json.loads(Path(local).read_text())[f"train/{DROPPING}"]
    assert "collect" in reason and "dp.max-epsilon" in reason
    for site in SITES:  # clear per-site metrics, but none that reveals an update
        assert len(_values(client, run_id, f"site/{site}/steps")) == ROUNDS
        assert _values(client, run_id, f"site/{site}/residual-norm") == []
        state = data_root / site / ".fedmed-state" / run_id
        assert not (state / "secagg-round.json").exists()  # deleted after the unmask


def test_fedyogi_steps_on_the_unmasked_sum_and_its_moments_are_checkpointed(secure_federation):
    tmp, _, _, client, run = secure_federation
    assert run.data.params["strategy.server-opt"] == "yogi"
    checkpoint = load_checkpoint(tmp / "checkpoints" / run.info.run_id / CHECKPOINT_FILE, None)
    assert checkpoint.server_round == ROUNDS
    yogi = checkpoint.strategy["server-opt"]  # the optimizer's attributes (no template)
    assert yogi["rounds"] == ROUNDS and yogi["eta"] == 0.01
    trained = [a for a in checkpoint.arrays if a.dtype.kind == "f"]
    assert 0 < len(yogi["m"]) <= len(trained)  # float parameters only, no statistics
    assert all(np.isfinite(m).all() and (v >= 0).all() for m, v in zip(yogi["m"], yogi["v"]))
