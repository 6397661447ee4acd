"""Gaps of the trust boundary next to the roster (issue #12, item 1 and 2 leftovers).

Evaluate replies' ``num-examples`` are capped like train replies (first
evaluate declaration), and a reply Multi-Krum leaves out of the aggregate does
not count in the round's train averages either.
"""

from __future__ import annotations

import numpy as np
import pytest

from strategies.rounds.update_stream import with_defence
from strategies.plugins.registries import AGGREGATORS, DEFENCES
from strategies.rounds.reply_intake import TrainReply
from strategies.rounds.round_metrics import aggregated_replies
from strategies.rounds.site_book import SiteBook
from strategies.wire import message_keys as keys
from tests.strategies.test_federated_strategy import _train_metrics, make_strategy
from tests.strategies.test_roster import _evaluate
from tests.strategies.test_trust_boundary import _delta, _round

pytestmark = pytest.mark.usefixtures("server_identity")


# ------------------------------------------------------------- evaluate sizes
def test_an_evaluate_reply_cannot_inflate_its_examples_after_its_first():
    strategy = make_strategy(min_nodes=2)
    _evaluate(strategy, 1, [8, 2], {8: (10, 1.0, "a"), 2: (10, 0.0, "b")})
    metrics = _evaluate(strategy, 2, [8, 2], {8: (10, 1.0, "a"), 2: (10**15, 0.0, "b")})
    assert metrics["val-dice"] == pytest.approx(0.5)
    assert metrics[keys.NUM_EXAMPLES] == 20.0
    assert strategy.reports[2].evaluate["b"][keys.NUM_EXAMPLES] == 10.0


def test_evaluate_and_train_caps_are_kept_apart_and_checkpointed():
    book = SiteBook()
    book.learn(1, "a", num_examples=100)
    assert book.capped(1, 20, evaluate=True) == 20     # a validation split is smaller
    book = SiteBook.restore(book.snapshot())
    assert book.capped(1, 10**15, evaluate=True) == 20
    assert book.capped(1, 100) == 100
    assert SiteBook.restore({"site_of": {}, "sizes": {}, "last_losses": {}}) == SiteBook()


# ---------------------------------------------------- Multi-Krum's left-outs
def test_a_reply_multi_krum_leaves_out_does_not_count_in_the_train_averages():
    strategy = make_strategy(min_nodes=4)
    strategy.train.aggregator = with_defence(DEFENCES.create("multi-krum", f=1),
                                             AGGREGATORS.create("fedavg"))
    honest = {node: (_delta(0.1 * (node - 1)), _train_metrics(10, loss=0.5),
                     f"hospital-0{node - 1}") for node in (2, 3, 4)}
    outlier = {5: (_delta(100.0), _train_metrics(30, loss=50.0), "hospital-04")}
    arrays, metrics = _round(strategy, 1, [2, 3, 4, 5], {**honest, **outlier})
    report = strategy.reports[1]
    assert report.strategy["krum-selected/hospital-04"] == 0.0
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], [0.8, 1.8], rtol=1e-6)
    assert metrics[keys.TRAIN_LOSS] == pytest.approx(0.5)
    assert metrics[keys.NUM_EXAMPLES] == 30.0
    assert report.train_aggregate[keys.TRAIN_LOSS] == pytest.approx(0.5)
    assert report.train["hospital-04"][keys.TRAIN_LOSS] == 50.0   # its own series stays


def test_aggregated_replies_keeps_all_without_a_selection_record():
    strategy = make_strategy(min_nodes=2)
    _, metrics = _round(strategy, 1, [8, 2], {
        8: (_delta(0.0), _train_metrics(10, loss=1.0), "a"),
        2: (_delta(0.0), _train_metrics(30, loss=3.0), "b")})
    assert metrics[keys.TRAIN_LOSS] == pytest.approx(2.5)


def test_only_a_selection_record_of_zero_leaves_a_reply_out():
    a, b, c = (TrainReply(node_id=i, site=name, delta=[], num_examples=1, steps=1,
                          train_loss=0.0) for i, name in enumerate(("a", "b-selected/x", "c")))
    info = {"krum-selected/a": 1.0, "krum-selected/b-selected/x": 0.0, "clip-factor/c": 0.0,
            "krum-kept": 2.0}
    assert aggregated_replies([a, b, c], info) == [a, c]
