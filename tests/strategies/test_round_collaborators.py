"""The strategy loop's collaborators on their own: weighted mean, site book, plan, traffic."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, MessageType

from strategies.rounds.reply_intake import MetricsReply, TrainReply
from strategies.rounds.instructions import TrainPlan, Uplink, query_messages, site_messages
from strategies.rounds.round_metrics import (example_weighted_metrics, record_traffic,
                                             weighted_mean)
from strategies.rounds.round_report import RoundReport
from strategies.rounds.site_book import SiteBook
from strategies.wire import message_keys as keys

pytestmark = pytest.mark.usefixtures("server_identity")


def test_weighted_mean_weights_by_examples_and_is_nan_without_weight():
    assert weighted_mean([(0.2, 10), (0.6, 30)]) == pytest.approx(0.5)
    assert weighted_mean(iter([(1.0, 1)])) == 1.0
    assert math.isnan(weighted_mean([]))
    assert math.isnan(weighted_mean([(3.0, 0)]))


def test_round_metrics_average_over_the_reporting_sites_and_total_the_examples():
    replies = [MetricsReply(1, "a", 10, {keys.NUM_EXAMPLES: 10.0, "val-dice": 0.2, "x": 1.0}),
               MetricsReply(2, "b", 30, {keys.NUM_EXAMPLES: 30.0, "val-dice": 0.6})]
    assert example_weighted_metrics(replies) == pytest.approx(
        {"val-dice": 0.5, "x": 1.0, keys.NUM_EXAMPLES: 40.0})
    assert example_weighted_metrics([]) == {}


def test_site_book_snapshot_keeps_the_checkpoint_format():
    book = SiteBook()
    book.learn(3, "site-c", num_examples=12, loss=0.7)
    book.learn(4, "site-d")
    assert book.label(3) == "site-c" and book.label(9) == "node-9"
    assert book.offline([3]) == ["site-d"]
    state = pickle.loads(pickle.dumps(book.snapshot()))
    assert state == {"sizes": {3: 12}, "last_losses": {3: 0.7},
                     "site_of": {3: "site-c", 4: "site-d"}, "evaluate_sizes": {}}
    assert SiteBook.restore(state) == book


def test_train_plan_gives_each_site_its_tau_and_own_codec_seed():
    uplink = Uplink(codec="topk:0.1", error_feedback=False, federation="run", time_budget=2,
                    seed=5)
    plan = TrainPlan.for_round([1, 2], 6, uplink, server_round=3)
    assert plan.tau_of(1) == 6 and plan.tau_of(99) == 6 and plan.seed_of(99) == 0
    assert plan.seed_of(1) != plan.seed_of(2)
    settings = plan.settings(2, uplink)
    assert list(settings) == [keys.LOCAL_STEPS, keys.TIME_BUDGET, keys.CODEC,
                              keys.ERROR_FEEDBACK, keys.CODEC_SEED, keys.FEDERATION]
    assert settings[keys.CODEC_SEED] == plan.seed_of(2) and settings[keys.TIME_BUDGET] == 2.0


def test_messages_are_fresh_per_site_and_queries_carry_the_subset():
    arrays = ArrayRecord([np.zeros(2)])
    messages = site_messages([1, 2], arrays, ConfigRecord({"lr": 0.1}), 4, MessageType.TRAIN,
                             lambda node: {"who": node})
    assert [m.content[keys.CONFIG]["who"] for m in messages] == [1, 2]
    assert messages[0].content[keys.CONFIG] is not messages[1].content[keys.CONFIG]
    query = query_messages([7], arrays, 4, subset=16)[0]
    assert query.metadata.message_type == MessageType.QUERY
    assert dict(query.content[keys.CONFIG]) == {keys.SERVER_ROUND: 4, keys.LOSS_SUBSET: 16}


def test_traffic_counts_bytes_per_site_and_the_round_ratio():
    report = RoundReport(1)
    reply = TrainReply(node_id=1, site="a", delta=[], num_examples=1, steps=1, train_loss=0.0,
                       wire_bytes=10)
    record_traffic(report, {1: 100, 2: 50}, [reply], [np.zeros(5, np.float32)],
                   lambda n: {1: "a"}.get(n, f"node-{n}"))
    assert report.traffic["a"] == {"bytes-down": 100.0, "bytes-up": 10.0, "uplink-ratio": 2.0}
    assert report.strategy == {"bytes-up": 10.0, "bytes-down": 150.0, "dense-bytes": 20.0,
                               "uplink-ratio": 2.0}


def test_a_metric_one_site_omits_is_averaged_over_the_sites_reporting_it() -> None:
    # #12: a one-class validation split has no AUC; the site omits it and the round keeps val-auc.
    a = MetricsReply(node_id=1, site="a", num_examples=10, metrics={"val-accuracy": 0.9})
    b = MetricsReply(node_id=2, site="b", num_examples=30, metrics={"val-auc": 0.7, "val-accuracy": 0.8})
    out = example_weighted_metrics([a, b])
    assert out["val-auc"] == pytest.approx(0.7)
    assert out["val-accuracy"] == pytest.approx(0.825)
    assert out[keys.NUM_EXAMPLES] == 40.0
