"""Normalisation statistics and counters after aggregation
(strategies/rounds/normalisation_statistics.py).

Found by their ``state_dict`` names; the median of the sites' statistics updates when a
defence is on, even when the round streams (the updates released once folded); a variance
kept >= 0 and finite, a mean finite, a counter advanced by 0..tau.
"""

from __future__ import annotations

import numpy as np
import pytest

from strategies.plugins.defences.norm_bound import NormBoundDefence
from strategies.plugins.registries import AGGREGATORS
from strategies.rounds.reply_intake import TrainReply
from strategies.rounds.normalisation_statistics import RoundStatistics, StatisticPositions
from strategies.rounds.update_stream import UpdateStream, with_defence

KEYS = ["conv.weight", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]
REFERENCE = [np.zeros(2, np.float32), np.zeros(2, np.float32), np.ones(2, np.float32),
             np.array(10, np.int64)]


def _delta(weight: float, mean: float, var: float, counter: int) -> list[np.ndarray]:
    return [np.full(2, weight, np.float32), np.full(2, mean, np.float32),
            np.full(2, var, np.float32), np.array(counter, np.int64)]


def _reply(node: int, delta: list[np.ndarray]) -> TrainReply:
    return TrainReply(node_id=node, site=f"site-{node}", delta=delta, num_examples=10,
                      steps=4, train_loss=0.1)


def test_statistics_are_found_by_their_names_and_dtypes():
    keys = [*KEYS, "running_var", "head.running_var_scale", "bn2.num_batches_tracked"]
    arrays = [*REFERENCE, np.ones(1, np.float32), np.ones(1, np.float32),
              np.ones(1, np.float32)]  # a float "counter" is no counter
    positions = StatisticPositions.of(keys, arrays)
    assert positions == StatisticPositions(variances=(2, 4), means=(1,), counters=(3,))
    assert positions.estimates == (1, 2, 4)
    assert not StatisticPositions.of(["conv.weight"], [np.zeros(1, np.float32)])


def test_the_median_replaces_the_mean_when_a_defence_is_on_even_streaming():
    aggregator = with_defence(NormBoundDefence(absolute=1e6, kappa=0.0),
                              AGGREGATORS.create("fedavg"))
    stream = UpdateStream()
    stream.start(aggregator, REFERENCE, [1, 2, 3])
    assert stream.streaming
    statistics = RoundStatistics(stream)
    statistics.start(KEYS, REFERENCE, robust=True)
    replies = [_reply(1, _delta(1.0, 0.1, 0.2, -4)), _reply(2, _delta(1.0, 0.3, 0.2, -4)),
               _reply(3, _delta(1.0, -50.0, 0.9, -4))]
    kept = [statistics.admit(reply) for reply in replies]
    assert all(reply.delta == [] for reply in kept)  # the stream released the updates
    outcome = stream.finish(kept, {})
    delta, info = statistics.settle(REFERENCE, outcome.delta, outcome.used, tau=4)
    np.testing.assert_allclose(delta[0], [1.0, 1.0])  # weights: the aggregator's mean
    np.testing.assert_allclose(delta[1], [0.1, 0.1], rtol=1e-6)  # median, not -16.5
    np.testing.assert_allclose(delta[2], [0.2, 0.2], rtol=1e-6)
    assert delta[3] == -4
    assert info == {"statistics-repaired": 0.0, "counters-bounded": 0.0}


def test_without_a_defence_the_aggregate_stands_and_nothing_is_kept():
    statistics = RoundStatistics(UpdateStream())
    statistics.start(KEYS, REFERENCE, robust=False)
    statistics.sink.start(AGGREGATORS.create("fedavg"), REFERENCE, [1])
    statistics.admit(_reply(1, _delta(0.0, 0.5, 0.5, -1)))
    assert statistics.kept == {}
    delta, _ = statistics.settle(REFERENCE, _delta(0.0, 0.5, 0.5, -1), [], tau=4)
    np.testing.assert_allclose(delta[1], [0.5, 0.5])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_statistics_keep_their_previous_values(bad):
    statistics = RoundStatistics(UpdateStream())
    statistics.start(KEYS, REFERENCE, robust=False)
    aggregate = _delta(0.5, 0.0, 0.0, -1)
    aggregate[1][0], aggregate[2][1] = bad, 2.0  # a mean non-finite, a variance -1
    delta, info = statistics.settle(REFERENCE, aggregate, [], tau=4)
    np.testing.assert_array_equal(delta[1], [0.0, 0.0])
    np.testing.assert_array_equal(delta[2], [0.0, 0.0])
    assert info["statistics-repaired"] == 2.0
    np.testing.assert_array_equal(delta[0], [0.5, 0.5])  # the weights are not touched


@pytest.mark.parametrize(("counter", "advance"), [(-3, 3), (-9, 4), (5, 0),
                                                  (np.iinfo(np.int64).min, 4)])
def test_a_counter_advances_by_zero_to_tau(counter, advance):
    statistics = RoundStatistics(UpdateStream())
    statistics.start(KEYS, REFERENCE, robust=False)
    delta, info = statistics.settle(REFERENCE, _delta(0.0, 0.0, 0.0, counter), [], tau=4)
    assert REFERENCE[3] - delta[3] == 10 + advance and delta[3].dtype == np.int64
    assert info["counters-bounded"] == float(advance != -counter)


def test_a_counter_never_overflows():
    reference = [*REFERENCE[:3], np.array(np.iinfo(np.int64).max - 1, np.int64)]
    statistics = RoundStatistics(UpdateStream())
    statistics.start(KEYS, reference, robust=False)
    delta, _ = statistics.settle(reference, _delta(0.0, 0.0, 0.0, -4), [], tau=4)
    assert reference[3] - delta[3] == np.iinfo(np.int64).max
