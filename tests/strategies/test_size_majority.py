"""One liar among three sites cannot take a majority of FedAvg's weight (issue #45, found 7).

Without a roster, a site claiming ``num-examples = 1e15`` was weighted as 3 x the median of
the other sites' first declarations (``federation.max-size-ratio``): at 3 equal sites that
is 30 of 50 examples, 60% of the weight. Now the relative cap is also at most the sum of
the other sites' declarations once there are two of them (:meth:`SiteBook.relative_cap`):
from 3 sites up no site outweighs all the others together.
"""

from __future__ import annotations

import numpy as np
import pytest

from strategies.rounds.site_book import SiteBook
from strategies.wire import message_keys as keys
from tests.strategies.test_federated_strategy import GLOBAL, _train_metrics, make_strategy
from tests.strategies.test_trust_boundary import _delta, _round

pytestmark = pytest.mark.usefixtures("server_identity")

LIAR = 10**15


def _liar_weight(honest: list[int]) -> tuple[float, float]:
    """The weight FedAvg gave a liar (update -1, 1e15 examples) next to honest sites (update
    +1, ``honest`` examples), read off the new model, and the examples it was counted as."""
    nodes = [10 + i for i in range(len(honest))] + [2]
    answers = {node: (_delta(1.0), _train_metrics(n), f"h{i}")
               for i, (node, n) in enumerate(zip(nodes, honest))}
    answers[2] = (_delta(-1.0), _train_metrics(LIAR), "liar")
    strategy = make_strategy(min_nodes=len(nodes))
    arrays, _ = _round(strategy, 1, nodes, answers)
    # x - Delta with Delta = (1 - p) - p: p = (1 + (x_new - x)) / 2
    step = float(arrays.to_numpy_ndarrays()[0][0] - GLOBAL[0][0])
    return (1.0 + step) / 2.0, strategy.reports[1].train["liar"][keys.NUM_EXAMPLES]


def test_at_three_sites_the_liar_weighs_no_more_than_the_others_together():
    weight, counted = _liar_weight([10, 10])
    assert counted == 20.0  # before: 3 x median(10, 10) = 30, 60% of the weight
    assert weight == pytest.approx(0.5, abs=1e-6)
    weight, counted = _liar_weight([10, 30])
    assert counted == 40.0 and weight == pytest.approx(0.5, abs=1e-6)  # before: 60 of 100


def test_at_two_sites_the_liar_is_held_at_the_ratio():
    weight, counted = _liar_weight([10])
    # one of two cannot be told from the other: r x the other, r / (r + 1) of the weight
    assert counted == 30.0 and weight == pytest.approx(0.75, abs=1e-6)


def test_at_five_sites_the_ratio_binds_first():
    weight, counted = _liar_weight([10, 10, 10, 10])
    assert counted == 30.0  # min(3 x median 10, sum 40)
    assert weight == pytest.approx(3 / 7, abs=1e-6)


def test_the_book_caps_at_the_others_sum_from_two_others_up():
    book = SiteBook(sizes={1: 10, 2: 30, 3: 50, 4: 0}, max_size_ratio=3.0)
    assert book.relative_cap(3) == 40  # min(3 x median(10, 30) = 60, 10 + 30)
    assert book.relative_cap(1) == 80  # min(3 x 40 = 120, 30 + 50)
    assert SiteBook(sizes={1: 10, 2: 5}).relative_cap(1) == 15  # one other: 3 x 5
    honest = SiteBook(sizes={1: 10, 2: 12, 3: 9, 4: 11})
    assert all(honest.relative_cap(node) > size for node, size in honest.sizes.items())
    big = SiteBook(sizes={1: 10, 2: 10, 3: 25})  # more than the two others together
    assert big.relative_cap(3) == 20
