"""Sizes without a roster: a declaration is capped relative to the others (issue #29, found 2).

Without a roster a site claiming ``num-examples = 1e15`` in its first reply was
the aggregate (its own delta, to 5e-6). Now each declaration is at most
``federation.max-size-ratio`` (default 3) x the median of the other sites'
first declarations (and, from two others up, at most their sum:
tests/strategies/test_size_majority.py); a round whose sites have not all declared yet holds its
updates (FedAvg streams otherwise) and caps them when it closes.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.config.run_config import RunConfig
from app.server_app import build_strategy
from strategies.plugins.registries import AGGREGATORS
from strategies.rounds.site_book import SiteBook
from strategies.rounds.update_stream import UpdateStream
from strategies.wire import message_keys as keys
from strategies.wire.errors import ConfigError
from tests.strategies.test_federated_strategy import GLOBAL, _train_metrics, make_strategy
from tests.strategies.test_roster import _evaluate
from tests.strategies.test_trust_boundary import _delta, _round

pytestmark = pytest.mark.usefixtures("server_identity")

LIAR = 10**15


def test_a_site_lying_from_its_first_reply_is_capped_at_three_times_the_other():
    strategy = make_strategy(min_nodes=2)  # fedavg, no defence: it streams
    arrays, metrics = _round(strategy, 1, [8, 2], {
        8: (_delta(1.0), _train_metrics(10), "a"),
        2: (_delta(-1.0), _train_metrics(LIAR), "b")})
    # weights 10 and 3 x median(10) = 30: Delta = (10 - 30) / 40
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], GLOBAL[0] + 20 / 40, rtol=1e-6)
    assert metrics[keys.NUM_EXAMPLES] == 40.0
    assert strategy.reports[1].train["b"][keys.NUM_EXAMPLES] == 30.0
    assert strategy.reports[1].strategy["size-cap/b"] == 30.0
    assert "size-cap/a" not in strategy.reports[1].strategy


def test_the_cap_holds_in_later_streamed_rounds_and_at_three_sites():
    strategy = make_strategy(min_nodes=3)
    answers = {8: (_delta(1.0), _train_metrics(10), "a"),
               3: (_delta(1.0), _train_metrics(30), "c"),
               2: (_delta(-1.0), _train_metrics(LIAR), "b")}
    _round(strategy, 1, [8, 3, 2], answers)
    assert not strategy.train.stream.streaming  # b's size was unknown when round 1 began
    arrays, _ = _round(strategy, 2, [8, 3, 2], answers)
    assert strategy.train.stream.streaming  # every size known: folded as they arrive
    # b: min(3 x median(10, 30) = 60, 10 + 30) = 40 (issue #45: no majority of the weight);
    # Delta = (10 + 30 - 40) / 80
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], GLOBAL[0], rtol=1e-6)
    assert strategy.reports[2].train["b"][keys.NUM_EXAMPLES] == 40.0
    # the honest sites' caps (3 x the median with b's 1e15 in it) do not bind
    assert strategy.reports[2].train["a"][keys.NUM_EXAMPLES] == 10.0
    assert strategy.reports[2].train["c"][keys.NUM_EXAMPLES] == 30.0


def test_a_single_site_or_a_ratio_of_zero_is_not_capped():
    alone = make_strategy(min_nodes=1)
    _, metrics = _round(alone, 1, [8], {8: (_delta(1.0), _train_metrics(LIAR), "a")})
    assert metrics[keys.NUM_EXAMPLES] == float(LIAR)
    off = make_strategy(min_nodes=2, max_size_ratio=0.0)
    arrays, _ = _round(off, 1, [8, 2], {8: (_delta(1.0), _train_metrics(10), "a"),
                                        2: (_delta(-1.0), _train_metrics(LIAR), "b")})
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], GLOBAL[0] + 1.0, rtol=1e-5)
    assert off.train.stream.streaming


def test_evaluate_declarations_are_capped_relative_to_the_others():
    strategy = make_strategy(min_nodes=2)
    metrics = _evaluate(strategy, 1, [8, 2], {8: (10, 0.5, "a"), 2: (LIAR, 1.0, "b")})
    # val-dice weighted 10 : 30
    assert metrics["val-dice"] == pytest.approx((10 * 0.5 + 30 * 1.0) / 40)


def test_the_book_caps_at_the_ratio_times_the_median_of_the_others():
    book = SiteBook(sizes={1: 10, 2: 30, 3: 50, 4: 0}, max_size_ratio=2.0)
    assert book.relative_cap(3) == 40  # 2 x median(10, 30); a 0 declaration is not counted
    assert book.relative_cap(1) == 80  # 2 x median(30, 50)
    assert SiteBook(sizes={1: 10}, max_size_ratio=2.0).relative_cap(1) is None
    assert SiteBook(sizes={1: 10, 2: 5}, roster={"a": 9}).relative_cap(1) is None
    assert book.sizes_pending([1, 5]) and not book.sizes_pending([1, 2])
    assert not SiteBook(sizes={}).sizes_pending([1])  # a single site: nothing to compare


def test_a_round_held_for_sizes_stays_within_the_held_bound():
    reference = [np.zeros(2**18, np.float32)]  # 1 MiB
    book = SiteBook(sizes={1: 10})
    stream = UpdateStream(max_held_mb=2)
    stream.start(AGGREGATORS.create("fedavg"), reference, [1, 2], book)  # 2 MiB: fits
    assert not stream.streaming
    with pytest.raises(ConfigError, match=r"'round\.max-held-mb' = 2: the round holds all 3 "
                                          r".* 'federation\.max-size-ratio' = 0"):
        stream.start(AGGREGATORS.create("fedavg"), reference, [1, 2, 3], book)
    stream.start(AGGREGATORS.create("fedavg"), reference, [1, 2, 3],
                 SiteBook(sizes={1: 10, 2: 10, 3: 10}))
    assert stream.streaming


def test_the_products_default_strategy_caps_a_first_declaration():
    """Through ``build_strategy`` with the default run config (norm-bound, no roster)."""
    strategy = build_strategy(RunConfig.from_mapping({"min-nodes": 2, "local-steps": 3}))
    arrays, _ = _round(strategy, 1, [8, 2], {
        8: (_delta(1.0), _train_metrics(10), "a"),
        2: (_delta(-1.0), _train_metrics(LIAR), "b")})
    # equal norms: nothing clipped; weights 10 and 30
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], GLOBAL[0] + 20 / 40, rtol=1e-6)
    assert strategy.reports[1].strategy["size-cap/b"] == 30.0
