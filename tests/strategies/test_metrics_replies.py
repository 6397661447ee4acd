"""Evaluate and query replies: a site without items in the evaluated split replies counts only."""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from strategies.rounds.reply_intake import InvalidReplyError, parse_metrics_reply
from strategies.rounds.round_metrics import example_weighted_metrics
from strategies.wire import message_keys as keys

pytestmark = pytest.mark.usefixtures("server_identity")


def _reply(metrics: dict, site: str = "a") -> Message:
    instruction = Message(RecordDict(), dst_node_id=3, message_type="evaluate")
    instruction.metadata.__dict__["_message_id"] = f"m-{site}"
    content = RecordDict({keys.SITE: ConfigRecord({keys.SITE_NAME: site}),
                          keys.METRICS: MetricRecord(metrics)})
    return Message(content, reply_to=instruction)


def test_an_evaluate_reply_of_zero_examples_is_accepted_and_weighs_nothing():
    empty = parse_metrics_reply(_reply({keys.NUM_EXAMPLES: 0, "val-studies": 0}, "test-only"))
    full = parse_metrics_reply(_reply({keys.NUM_EXAMPLES: 4, "val-studies": 2,
                                       "val-dice": 0.5}, "b"))
    assert empty.num_examples == 0
    merged = example_weighted_metrics([empty, full])
    assert merged["val-dice"] == pytest.approx(0.5)
    assert merged[keys.NUM_EXAMPLES] == 4.0


@pytest.mark.parametrize("count", [-1, 2.5])
def test_an_evaluate_reply_needs_a_non_negative_integer_count(count):
    with pytest.raises(InvalidReplyError, match="non-negative integer|counts are >= 0"):
        parse_metrics_reply(_reply({keys.NUM_EXAMPLES: count}))


def test_a_query_reply_of_zero_examples_is_still_refused():
    with pytest.raises(InvalidReplyError, match="positive integer"):
        parse_metrics_reply(_reply({keys.NUM_EXAMPLES: 0, keys.QUERY_LOSS: 0.3}),
                            keys.QUERY_REQUIRED)


def test_study_counts_are_totals_not_means():
    """Found: the federation's test-studies was the example-weighted mean of the sites' counts."""
    a = parse_metrics_reply(_reply({keys.NUM_EXAMPLES: 180, keys.TEST_STUDIES: 180,
                                    "test-auc": 0.9}, "a"))
    b = parse_metrics_reply(_reply({keys.NUM_EXAMPLES: 108, keys.TEST_STUDIES: 108,
                                    "test-auc": 0.8}, "b"))
    merged = example_weighted_metrics([a, b])
    assert merged[keys.TEST_STUDIES] == 288.0
    assert merged["test-auc"] == pytest.approx((0.9 * 180 + 0.8 * 108) / 288)
    assert keys.VAL_STUDIES not in merged
