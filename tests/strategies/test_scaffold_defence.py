"""SCAFFOLD's ``Delta c_i`` behind the update's defence and rule (issue #45, found 7).

strategies/plugins/control_variates/control_variate_round.py: the decoded ``Delta c_i`` go
through a copy of the run's defence (norm-bound: clipped to kappa x the lower median of the round's
``Delta c_i`` norms, and from round 2 on to history-kappa x the earlier rounds' accepted
norms; its history checkpointed with ``c``) and, behind a robust aggregator, are combined by
its rule. Where the bound does not bind, ``c`` is plain SCAFFOLD's bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.config.run_config import RunConfig
from app.server_app import build_strategy
from strategies.compression import encode
from strategies.plugins.control_variates.control_variate_round import ControlVariateRound
from strategies.plugins.control_variates.scaffold import Scaffold
from strategies.rounds.update_stream import with_defence
from strategies.plugins.registries import AGGREGATORS, DEFENCES
from strategies.rounds.reply_intake import TrainReply
from strategies.rounds.instructions import TrainPlan
from strategies.rounds.checkpoint import decode_tree, encode_tree
from strategies.wire import message_keys as keys
from strategies.wire.update_codec import pack_update
from tests.strategies.test_federated_strategy import GLOBAL, _train_metrics
from tests.strategies.test_trust_boundary import _delta, _round

pytestmark = pytest.mark.usefixtures("server_identity")

REFERENCE = [np.zeros(4, np.float32)]
HONEST = [np.array([1.0, 2.0, 0.5, -1.0]), np.array([1.5, 1.0, 0.0, -0.5]),
          np.array([0.5, 2.5, 1.0, -1.5])]


def _replies(vectors: list[np.ndarray]) -> list[TrainReply]:
    return [TrainReply(node_id=i + 1, site=f"s{i + 1}", delta=[], num_examples=10, steps=3,
                       train_loss=1.0,
                       channels={keys.CONTROL_DELTA: encode(v.astype(np.float32), "none")})
            for i, v in enumerate(vectors)]


def _observe(rounds: ControlVariateRound, vectors: list[np.ndarray]) -> dict:
    plan = TrainPlan(tau={i + 1: 3 for i in range(len(vectors))},
                     codec_seeds={i + 1: 0 for i in range(len(vectors))}, codec="none")
    return rounds.add(_replies(vectors), plan, REFERENCE, sites=len(vectors))


def _scaffold(aggregator: str = "fedavg",
              defence: str = "norm-bound") -> tuple[Scaffold, ControlVariateRound]:
    scaffold = Scaffold()
    aggregated = with_defence(DEFENCES.create(defence), AGGREGATORS.create(aggregator))
    return scaffold, ControlVariateRound(scaffold, aggregator=aggregated)


def test_a_huge_delta_c_i_is_clipped_to_kappa_times_the_lower_median_norm():
    scaffold, rounds = _scaffold()
    attack = 1000.0 * HONEST[2]
    info = _observe(rounds, [HONEST[0], HONEST[1], attack])
    norms = [np.linalg.norm(v) for v in (*HONEST[:2], attack)]
    bound = 1.5 * sorted(norms)[1]  # norm-bound.kappa = 1.5 x the lower median
    assert info["scaffold-norm-bound"] == pytest.approx(bound)
    assert info["scaffold-clip-factor/s3"] == pytest.approx(bound / norms[2])
    assert info["scaffold-clip-factor/s1"] == info["scaffold-clip-factor/s2"] == 1.0
    expected = HONEST[0] + HONEST[1] + attack * (bound / norms[2])
    np.testing.assert_allclose(scaffold.total, expected, rtol=1e-6)
    # undefended, the same round took c to 1000 x an honest c_i
    plain = Scaffold()
    _observe(ControlVariateRound(plain), [HONEST[0], HONEST[1], attack])
    assert np.linalg.norm(plain.total) > 100 * np.linalg.norm(scaffold.total)


def test_honest_delta_c_i_within_the_bound_give_plain_scaffold_bit_for_bit():
    scaffold, rounds = _scaffold()
    plain = Scaffold()
    for server_round in range(3):  # the history bound from round 2 on does not bind either
        vectors = [v / (server_round + 1) for v in HONEST]
        info = _observe(rounds, vectors)
        _observe(ControlVariateRound(plain), vectors)
        assert all(info[f"scaffold-clip-factor/s{i}"] == 1.0 for i in (1, 2, 3))
        np.testing.assert_array_equal(scaffold.total, plain.total)
    assert len(scaffold.defence.history) == 3  # it learnt the accepted Delta c_i norms


def test_the_history_bound_holds_a_site_alone_in_a_round():
    scaffold, rounds = _scaffold()
    _observe(rounds, HONEST)
    alone = 1000.0 * HONEST[0]  # one reply: the round's lower median is its own norm
    info = _observe(rounds, [alone])
    reference = float(np.median([np.linalg.norm(v) for v in HONEST]))
    assert info["scaffold-norm-bound"] == pytest.approx(3.0 * reference)  # history-kappa
    assert info["scaffold-clip-factor/s1"] < 0.01


@pytest.mark.parametrize(("aggregator", "rule"), [("median", np.median),
                                                  ("trimmed-mean", np.mean)])
def test_behind_a_robust_aggregator_the_delta_c_i_are_combined_by_its_rule(aggregator, rule):
    scaffold, rounds = _scaffold(aggregator, defence="none")
    attack = np.array([1e6, -1e6, 1e6, 1e6])
    vectors = [*HONEST, HONEST[1] + 0.25, attack]  # 5 sites: trimmed-mean.beta 0.2 cuts one
    info = _observe(rounds, vectors)
    stack = np.sort(np.stack(vectors), axis=0)
    combined = rule(stack if aggregator == "median" else stack[1:-1], axis=0)
    np.testing.assert_allclose(scaffold.total, 5 * combined, rtol=1e-6)
    assert np.abs(scaffold.total).max() < 20 and info["scaffold-replies"] == 5


def test_multi_krum_leaves_the_outlying_delta_c_i_out():
    scaffold, rounds = _scaffold(defence="multi-krum")
    info = _observe(rounds, [*HONEST, 1000.0 * HONEST[0]])
    assert info["scaffold-krum-selected/s4"] == 0.0 and info["scaffold-krum-kept"] == 3
    np.testing.assert_allclose(scaffold.total, sum(HONEST), rtol=1e-6)


def _scaffold_round(strategy, server_round: int, boost: float):
    """One round of three sites through the strategy's aggregate_train, site c's Delta c_i
    times ``boost``."""
    answers = {}
    for node, site, vector in ((8, "a", HONEST[0]), (3, "b", HONEST[1]),
                               (2, "c", boost * HONEST[2])):
        payload = {**pack_update(_delta(1.0), "none"),
                   keys.CONTROL_DELTA: encode(np.resize(vector, 3).astype(np.float32), "none")}
        answers[node] = (payload, _train_metrics(10), site)
    return _round(strategy, server_round, [8, 3, 2], answers)


def test_the_products_default_strategy_defends_delta_c_i_and_checkpoints_its_history():
    """Through ``build_strategy`` (the default norm-bound) and ``aggregate_train``."""
    config = RunConfig.from_mapping({"min-nodes": 3, "local-steps": 3, "optimizer": "sgd",
                                     "strategy.control-variates": "scaffold"})
    strategy = build_strategy(config)
    _scaffold_round(strategy, 1, boost=1000.0)
    report = strategy.reports[1].strategy
    assert report["scaffold-clip-factor/c"] < 0.01 < report["scaffold-clip-factor/a"] == 1.0
    scaffold = strategy.train.feature(ControlVariateRound).control
    c = scaffold.total / scaffold.sites
    assert report["scaffold-c-norm"] == pytest.approx(np.linalg.norm(c))
    honest = np.linalg.norm(np.mean([np.resize(v, 3) for v in HONEST], axis=0))
    assert np.linalg.norm(c) < 2 * honest  # undefended: ~330 x
    tree, arrays = encode_tree(strategy.snapshot())
    restored = build_strategy(config)
    restored.restore(decode_tree(tree, arrays, restored.snapshot()))
    restored_scaffold = restored.train.feature(ControlVariateRound).control
    assert restored_scaffold.defence.history == scaffold.defence.history
    assert len(scaffold.defence.history) == 1
    arrays_out, _ = _scaffold_round(restored, 2, boost=1.0)
    np.testing.assert_allclose(arrays_out.to_numpy_ndarrays()[0], GLOBAL[0] - 1.0, rtol=1e-6)
