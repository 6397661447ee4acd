"""FedNova's normalisation is bounded (#29, found 6).

Found item: "FedNova steps. A site that reports 1 step of 8 gets about 8x weight
(tau-eff 5.667). It is documented, but nothing bounds it."

Now a reply's a-norm counts at least ``fednova.min-steps-fraction`` x the a-norm of
the tau it was sent (plain SGD: steps below the fraction of tau count as that
fraction), and the defence measures the update FedNova actually aggregates,
``tau ||a_i||_1^{-1} delta_i``.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Message, MetricRecord

from app.config.run_config import RunConfig
from app.engine import InProcessGrid, VirtualSite
from app.server_app import build_strategy
from strategies.plugins.aggregators.fednova import FedNovaAggregator, FedNovaOptions
from strategies.rounds.reply_intake import TrainReply
from strategies.wire import message_keys as keys
from strategies.wire.plugin_options import PluginError
from tests.fixtures.scripted_site import ScriptedSite

pytestmark = pytest.mark.usefixtures("server_identity")  # run 42, the SuperLink's node 1

INITIAL = [np.zeros(3, np.float32), np.array(0, np.int64)]
TAU = 8


def _unit(i: int):
    """An update that moves the global model by +1 along axis ``i`` only."""
    return lambda weights: [-np.eye(3, dtype=np.float32)[i], np.zeros((), np.int64)]


class StepsLiar(ScriptedSite):
    """A scripted site that reports ``steps`` local steps whatever tau it was sent."""

    steps: int = 1

    def __call__(self, message: Message, context: Context) -> Message:
        reply = super().__call__(message, context)
        if message.metadata.message_type == "train":
            metrics = dict(reply.content[keys.METRICS])
            reply.content[keys.METRICS] = MetricRecord({**metrics, keys.STEPS: self.steps})
        return reply


def _round(**run_config):
    """One FedNova round: site-0 and site-2 honest (tau 8) along axes 0 and 2, site-1
    reporting 1 step along axis 1; the per-site weights of the aggregate and the report."""
    handlers = [ScriptedSite("site-0", delta=_unit(0), num_examples=10),
                StepsLiar("site-1", delta=_unit(1), num_examples=10),
                ScriptedSite("site-2", delta=_unit(2), num_examples=10)]
    sites = [VirtualSite({"site-name": h.name}, h) for h in handlers]
    config = RunConfig.from_mapping({
        "min-nodes": 3, "node-wait-timeout": 5, "strategy.aggregator": "fednova",
        "optimizer": "sgd", "momentum": 0.0, "local-steps": TAU, **run_config})
    strategy = build_strategy(config)
    result = strategy.start(grid=InProcessGrid(sites, run_id=42),
                            initial_arrays=ArrayRecord(INITIAL), num_rounds=1)
    return result.arrays.to_numpy_ndarrays()[0], strategy.reports[1]


def test_a_site_lying_about_few_steps_gains_at_most_one_over_the_fraction():
    weights, report = _round(**{"strategy.defence": "none"})
    # fraction 0.5 by default: the liar's a-norm counts as 4 steps, not 1
    assert weights[1] / weights[0] == pytest.approx(2.0, rel=1e-5)
    assert weights[0] == pytest.approx(weights[2])
    assert report.strategy["tau-eff"] == pytest.approx((8 + 4 + 8) / 3)
    assert report.strategy["a-norm-floored/site-1"] == pytest.approx(4.0)
    assert "a-norm-floored/site-0" not in report.strategy


def test_with_momentum_the_floor_is_the_fraction_of_a_full_rounds_a_norm():
    weights, report = _round(**{"strategy.defence": "none", "momentum": 0.9})
    assert weights[1] / weights[0] == pytest.approx(2.0, rel=1e-5)
    assert report.strategy["a-norm-floored/site-1"] == pytest.approx(
        0.5 * report.train["site-0"]["a-norm"])


def test_the_defence_measures_fednovas_normalised_update():
    weights, report = _round(**{"fednova.min-steps-fraction": 0.125})
    # with the fraction 1/8 the liar's normalised update is 8x the honest ones:
    # norm-bound (kappa 1.5, the default, x the lower median) clips it to 1.5x
    assert report.strategy["clip-factor/site-1"] == pytest.approx(1.5 / 8.0, rel=1e-5)
    assert report.strategy["clip-factor/site-0"] == 1.0
    assert weights[1] / weights[0] == pytest.approx(1.5, rel=1e-5)


def _reply(i: int, steps: int, tau_a_norm: float = float(TAU)) -> TrainReply:
    return TrainReply(node_id=i, site=f"site-{i}", delta=[np.ones(3, np.float32)],
                      num_examples=10, steps=steps, train_loss=1.0, a_norm=float(steps),
                      tau_a_norm=tau_a_norm)


def test_the_update_scale_is_tau_over_the_a_norm_counted():
    fednova = FedNovaAggregator(min_steps_fraction=0.5)
    assert fednova.update_scale(_reply(0, 8)) == 1.0
    assert fednova.update_scale(_reply(1, 6)) == pytest.approx(8.0 / 6.0)
    assert fednova.update_scale(_reply(2, 1)) == pytest.approx(2.0)  # counted as 4 steps
    assert fednova.update_scale(_reply(3, 1, tau_a_norm=0.0)) == 1.0  # tau unknown


def test_the_fraction_is_checked_naming_the_key():
    with pytest.raises(PluginError, match="'fednova.min-steps-fraction'"):
        FedNovaOptions(min_steps_fraction=0.0)
    with pytest.raises(PluginError, match="'fednova.min-steps-fraction'"):
        FedNovaOptions(min_steps_fraction=1.5)
    assert FedNovaOptions(min_steps_fraction=1.0).min_steps_fraction == 1.0
