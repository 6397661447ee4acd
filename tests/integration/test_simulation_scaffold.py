"""End to end: SCAFFOLD in Flower's simulation engine (a real SuperLink, `flwr run`, Ray).

``python -m app.tooling.simulate`` (what ``make simulate`` runs) with
``strategy.control-variates = "scaffold"`` and a top-k uplink over two synthetic hospitals:
every train message carries the server's c, each ClientApp (a fresh one per message, in a Ray
worker) reads its c_i from its state dir, trains the corrected steps and sends Delta c_i
through top-k with its own error-feedback residual. The coordinator's checkpointed c is the
mean over the sites of what they hold minus what top-k has not sent yet: c_i - e_i.

The run has no defence (``strategy.defence = "none"``): since issue 45 a site's Delta c_i
passes the run's defence like its update, and the default norm-bound's history bound clips
an honest site's round-2 update and Delta c_i here (factors 0.81 and 0.89), after which c is
the mean of what the server accepted, not of what was sent (tests/app/test_scaffold_attack.py
and tests/strategies/test_scaffold_defence.py test that channel).
"""

from __future__ import annotations

import numpy as np
import pytest

from clients.site.site_scaffold import CONTROL_NAME, RESIDUAL_NAME
from strategies.rounds.checkpoint import CHECKPOINT_FILE, load_checkpoint
from tests.integration.simulation_run import simulated_federation

pytestmark = pytest.mark.integration

SITES = ("hospital-00", "hospital-01")
ROUNDS = 2
RUN_CONFIG = (
    f"num-server-rounds={ROUNDS}", "local-steps=2", "image-size=32", "batch-size=4",
    "min-nodes=2", "node-wait-timeout=60", "experiment=scaffold", "round-timeout=1200",
    "final-evaluation=false", "optimizer=sgd", "lr=0.05", "momentum=0.0",
    "strategy.control-variates=scaffold", "strategy.codec=topk:0.1", "strategy.defence=none",
)


@pytest.fixture(scope="module")
def scaffold_federation(tmp_path_factory, small_hospitals, mlflow_store):
    tmp = tmp_path_factory.mktemp("simulation-scaffold")
    data_root = tmp / "data"
    small_hospitals(data_root, 13)
    run_config = (*RUN_CONFIG, f"checkpoint-dir={tmp / 'checkpoints'}")
    with simulated_federation(tmp, data_root, len(SITES), run_config, "scaffold",
                              mlflow_store(tmp)) as (client, run):
        yield tmp, data_root, client, run


def test_every_round_adds_every_sites_delta_c(scaffold_federation):
    _, _, client, run = scaffold_federation
    assert run.info.status == "FINISHED"
    assert run.data.params["strategy.control-variates"] == "scaffold"
    replies = client.get_metric_history(run.info.run_id, "strategy/scaffold-replies")
    assert [m.value for m in sorted(replies, key=lambda m: m.step)] == [2.0] * ROUNDS
    assert client.get_metric_history(run.info.run_id, "strategy/scaffold-dc-missing") == []


def test_the_servers_c_is_the_mean_of_what_the_sites_sent(scaffold_federation):
    tmp, data_root, _, run = scaffold_federation
    checkpoint = load_checkpoint(tmp / "checkpoints" / run.info.run_id / CHECKPOINT_FILE, None)
    scaffold = checkpoint.strategy["control-variates"]  # the plug-in's attributes
    assert scaffold["sites"] == len(SITES)
    c = scaffold["total"] / scaffold["sites"]
    sent = []
    for site in SITES:
        state = data_root / site / ".fedmed-state" / run.info.run_id
        c_i, residual = (np.load(state / f"{CONTROL_NAME}.npy"),
                         np.load(state / f"{RESIDUAL_NAME}.npy"))
        assert np.abs(residual).max() > 0  # top-k left part of Delta c_i at the site
        sent.append(c_i - residual)
    np.testing.assert_allclose(c, np.mean(sent, axis=0), atol=1e-5)
    assert np.abs(c).max() > 0
