"""Server memory of the aggregation: FedAvg / FedNova add the updates, they never stack them.

In a round these two stream (each reply folded on arrival,
``tests/strategies/test_update_stream.py``); given a held set of updates (as
norm-bound with ``kappa`` holds them), what the aggregation allocates on top
must stay O(model), whatever the number of updates: one float64
accumulator per array position and the result, measured with ``tracemalloc``
(numpy reports its buffers to it). A stacking implementation allocates
``8 n`` bytes per entry and fails these bounds from ``n = 16``.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from strategies.aggregation import fedavg_delta, fednova_delta
from strategies.plugins.aggregators.fedavg import FedAvgAggregator
from strategies.rounds.update_stream import with_defence
from strategies.plugins.defences.norm_bound import NormBoundDefence
from strategies.rounds.reply_intake import TrainReply

ENTRIES = 250_000  # float32: 1 MB per update


def _updates(n: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(0)
    return [[rng.standard_normal(ENTRIES).astype(np.float32),
             np.array([i], dtype=np.int64)] for i in range(n)]


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("aggregate", [
    lambda ds: fedavg_delta(ds, [3 + i for i in range(len(ds))]),
    lambda ds: fednova_delta(ds, [3 + i for i in range(len(ds))],
                             [1.0 + i % 3 for i in range(len(ds))]),
], ids=["fedavg", "fednova"])
def test_weighted_aggregation_allocates_o_model_not_o_replies(aggregate):
    model_bytes = 4 * ENTRIES
    small, large = _updates(4), _updates(32)
    peak_small = _peak_bytes(lambda: aggregate(small))
    peak_large = _peak_bytes(lambda: aggregate(large))
    # accumulator (8 B/entry) + one float64 product + the float32 result: ~5 model sizes
    assert peak_large <= 6 * model_bytes
    assert peak_large <= peak_small + model_bytes // 4


def test_norm_bound_fedavg_allocates_the_clipped_copies_only():
    """norm-bound copies only the updates it scales (those above kappa x median)."""
    updates = _updates(32)
    for k in range(4):  # four outliers, 10x the others' norm: clipped
        updates[k][0] = updates[k][0] * np.float32(10.0)
    replies = [TrainReply(node_id=i, site=f"s{i}", delta=u, num_examples=5, steps=1,
                          train_loss=0.1) for i, u in enumerate(updates)]
    aggregator = with_defence(NormBoundDefence(kappa=3.0), FedAvgAggregator())
    model_bytes = 4 * ENTRIES
    delta, info = aggregator.aggregate(replies)
    assert sum(info[f"clip-factor/s{k}"] < 1.0 for k in range(32)) == 4
    assert _peak_bytes(lambda: aggregator.aggregate(replies)) <= (4 + 6) * model_bytes
    assert np.isfinite(delta[0]).all()
