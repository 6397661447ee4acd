"""Aggregators that finish from a secure sum: SecAgg+'s update is the plain round's.

Under SecAgg+ each site weighs its update by ``site_coefficient`` before masking, and the
coordinator finishes the unmasked sum with the aggregator's own ``finish``
(:func:`strategies.rounds.secure_train.secure_delta`): no second FedAvg or FedNova, no
branch on the aggregator's class. A rule without the capability (a robust one) is refused,
decided by :class:`~strategies.plugins.protocols.SecureSumAggregator`, not by a table of
names.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from strategies.aggregation import RunningSum, fedavg_finish, fedavg_fold
from strategies.plugins.protocols import Info, SecureSumAggregator
from strategies.plugins.registries import AGGREGATORS, SCHEDULES, SECURE_AGGREGATION, SELECTORS
from strategies.plugins.run_settings import RunSettings
from strategies.plugins.secure_aggregation.secagg_plus import SecAggOptions, SecAggPlus
from strategies.rounds.reply_intake import TrainReply
from strategies.rounds.federated_strategy import FederatedStrategy
from strategies.rounds.secure_train import secure_delta
from strategies.wire.local_solver import LocalSolver
from strategies.wire.plugin_options import PluginError
from strategies.wire.secure_aggregation.vector import flatten_float
from strategies.wire.secure_aggregation.weights import site_coefficient
from tests.strategies.scripted_grid import scripted_grid
from tests.strategies.secure_fake_sites import SecureSite, with_identities

MODEL = [np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(3, 2),
         np.ones(4, dtype=np.float32), np.array(5, dtype=np.int64)]
TAU = 8
SOLVER = LocalSolver()


class HalfStep:
    """A rule of no product class with the capability: FedAvg's update, halved."""

    needs_all_updates = False

    def update_scale(self, reply: TrainReply) -> float:
        return 1.0

    def aggregate(self, replies: list[TrainReply]) -> tuple[list[np.ndarray], Info]:
        total = RunningSum(replies[0].delta)
        for index, reply in enumerate(replies):
            self.fold(total, reply, index)
        return self.finish(total, replies)

    def fold(self, total: RunningSum, reply: TrainReply, index: int) -> Info:
        fedavg_fold(total, reply.delta, reply.num_examples, index)
        return {}

    def finish(self, total: RunningSum, replies: list[TrainReply]) -> tuple[list[np.ndarray], Info]:
        delta = fedavg_finish(total, float(sum(r.num_examples for r in replies)))
        return [d / 2 if d.dtype.kind == "f" else d for d in delta], {"half-step": 1.0}

    def secure_a_floor(self, tau_a_norm: float) -> float:
        return 0.0


def _replies(sizes: list[int], steps: list[int], seed: int = 0) -> list[TrainReply]:
    rng = np.random.default_rng(seed)
    return [TrainReply(node_id=10 + i, site=f"site-{i}", num_examples=n, steps=s,
                       train_loss=0.5, a_norm=SOLVER.a_norm(s), tau_a_norm=SOLVER.a_norm(TAU),
                       delta=[rng.uniform(-0.4, 0.4, a.shape).astype(a.dtype)
                              if a.dtype.kind == "f" else np.zeros_like(a) for a in MODEL])
            for i, (n, s) in enumerate(zip(sizes, steps))]


def _from_secure_sum(aggregator: SecureSumAggregator, replies: list[TrainReply],
                     reference: float) -> tuple[list[np.ndarray], Info]:
    """The coordinator's update of ``sum_i c_i v_i``, each ``c_i`` as the site computes it."""
    a_floor = aggregator.secure_a_floor(SOLVER.a_norm(TAU))
    total = sum(site_coefficient(r.num_examples, reference, r.a_norm, a_floor)
                * flatten_float(r.delta) for r in replies)
    return secure_delta(aggregator, total, replies, MODEL, reference, a_floor)


def _assert_float_arrays_close(delta: list[np.ndarray], expected: list[np.ndarray]) -> None:
    for got, want in zip(delta, expected):
        if want.dtype.kind == "f":
            assert got.dtype == want.dtype
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("name", "options"), [("fedavg", {}), ("fednova", {}),
                                               ("fednova", {"min_steps_fraction": 1.0})])
@pytest.mark.parametrize("steps", [[8, 8, 8], [8, 2, 5]])  # 2 < 0.5 x 8: floored at 4
def test_the_secure_sum_finishes_to_the_plain_aggregate(name, options, steps):
    replies = _replies([100, 40, 250], steps)
    delta, info = _from_secure_sum(AGGREGATORS.create(name, **options), replies, 250.0)
    plain, plain_info = AGGREGATORS.create(name, **options).aggregate(replies)
    _assert_float_arrays_close(delta, plain)
    assert int(delta[2]) == 0  # counters are the secure round's (the mean steps)
    if name == "fednova":
        assert info == {"tau-eff": pytest.approx(plain_info["tau-eff"])}
    else:
        assert info == plain_info == {}


@pytest.mark.parametrize("name", ["fedavg", "fednova"])
def test_a_site_reporting_more_than_the_reference_counts_as_the_reference(name):
    # its coefficient is capped at 1 (min(1, n / r)): it weighs as a site of r examples
    replies = _replies([100, 400], [8, 3])
    delta, _ = _from_secure_sum(AGGREGATORS.create(name), replies, 250.0)
    capped = [replies[0], replace(replies[1], num_examples=250)]
    _assert_float_arrays_close(delta, AGGREGATORS.create(name).aggregate(capped)[0])


def test_the_linear_rules_finish_from_a_secure_sum_and_the_robust_ones_do_not():
    capable = [name for name in AGGREGATORS.names()
               if isinstance(AGGREGATORS.create(name), SecureSumAggregator)]
    assert capable == ["fedavg", "fednova"]


def test_secagg_decides_by_the_capability_not_by_a_name(monkeypatch):
    AGGREGATORS.discover()
    # pylint: disable-next=protected-access
    monkeypatch.setitem(AGGREGATORS._entries, "half-step", HalfStep)
    settings = RunSettings(local_steps=TAU, num_rounds=1, fraction_train=1.0, min_nodes=2,
                           seed=0, optimizer="sgd", secure_aggregation="secagg+")
    SecAggPlus.requires(SecAggOptions(), replace(settings, aggregator="half-step"))
    for robust in ("median", "trimmed-mean"):
        with pytest.raises(PluginError, match=rf"'strategy.aggregator' = '{robust}'.*"
                                              r"\['fedavg', 'fednova', 'half-step'\]"):
            SecAggPlus.requires(SecAggOptions(), replace(settings, aggregator=robust))


def _secure_strategy(aggregator: object) -> FederatedStrategy:
    return FederatedStrategy(
        aggregator=aggregator, schedule=SCHEDULES.create("fixed", tau0=TAU),
        selector=SELECTORS.create("uniform"), min_nodes=3, node_wait_timeout=1,
        fraction_evaluate=0.0, secure_aggregation=SECURE_AGGREGATION.create("secagg+"))


def test_a_robust_rule_is_refused_by_the_secure_round_itself():
    with pytest.raises(PluginError, match=r"'strategy.aggregator' \(MedianAggregator\).*secagg\+"):
        _secure_strategy(AGGREGATORS.create("median"))


@pytest.mark.usefixtures("server_identity")
def test_a_custom_rule_with_the_capability_runs_a_secure_round():
    replies = _replies([20, 40, 60], [TAU] * 3)
    sites = with_identities({r.node_id: SecureSite(r.site, num_examples=r.num_examples,
                                                   update=r.delta) for r in replies})
    strategy = _secure_strategy(HalfStep())
    initial = ArrayRecord({f"a{j}": Array(a.copy()) for j, a in enumerate(MODEL)})
    new = strategy.start(scripted_grid(sites), initial, num_rounds=1).arrays.to_numpy_ndarrays()
    half = HalfStep().aggregate(replies)[0]
    for j in (0, 1):
        np.testing.assert_allclose(new[j], MODEL[j] - half[j], atol=2e-5)
    assert strategy.reports[1].strategy["half-step"] == 1.0
