"""Issue 16 on the server: evaluate instructions name the federation, and MLflow's round
record holds each site's personalised metric and its difference to the global one."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from app.tracking.tracker import round_record
from strategies import message_keys as keys
from strategies.plugins.registries import AGGREGATORS, SCHEDULES, SELECTORS
from strategies.rounds.federated_strategy import FederatedStrategy

pytestmark = pytest.mark.usefixtures("server_identity")


class _Grid:
    def get_node_ids(self) -> list[int]:
        return [1, 2]


def _evaluated(replies: dict[int, dict]) -> tuple[FederatedStrategy, list[Message]]:
    strategy = FederatedStrategy(aggregator=AGGREGATORS.create("fedavg"),
                                 schedule=SCHEDULES.create("fixed", tau0=2),
                                 selector=SELECTORS.create("uniform"), min_nodes=2,
                                 node_wait_timeout=1, federation="fed-7")
    messages = list(strategy.configure_evaluate(
        1, ArrayRecord([np.zeros(2, np.float32)]), ConfigRecord(), _Grid()))
    for i, message in enumerate(messages):
        message.metadata.__dict__["_message_id"] = f"e-{i}"
    answers = [Message(RecordDict({
        keys.SITE: ConfigRecord({keys.SITE_NAME: f"h{m.metadata.dst_node_id}"}),
        keys.METRICS: MetricRecord(replies[m.metadata.dst_node_id])}), reply_to=m)
        for m in messages]
    strategy.aggregate_evaluate(1, answers)
    return strategy, messages


def test_evaluate_instructions_carry_the_federation():
    _, messages = _evaluated({1: {keys.NUM_EXAMPLES: 1}, 2: {keys.NUM_EXAMPLES: 1}})
    assert [m.content[keys.CONFIG][keys.FEDERATION] for m in messages] == ["fed-7", "fed-7"]


def test_personalised_metrics_and_their_gain_reach_the_round_record():
    strategy, _ = _evaluated({
        1: {keys.NUM_EXAMPLES: 10, "val-auc": 0.5, "personalised-val-auc": 0.75},
        2: {keys.NUM_EXAMPLES: 30, "val-auc": 0.25, "personalised-val-auc": 0.5}})
    metrics = round_record(strategy.reports[1]).metrics
    assert metrics["site/h1/personalised-val-auc"] == 0.75
    assert metrics["site/h1/personalised-gain-val-auc"] == 0.25
    assert metrics["site/h2/personalised-gain-val-auc"] == 0.25
    assert metrics["eval/personalised-val-auc"] == pytest.approx(0.5625)
    assert metrics["eval/personalised-gain-val-auc"] == pytest.approx(0.25)


def test_without_personalisation_no_personalised_metric_is_logged():
    strategy, _ = _evaluated({1: {keys.NUM_EXAMPLES: 10, "val-auc": 0.5},
                              2: {keys.NUM_EXAMPLES: 30, "val-auc": 0.25}})
    assert not [k for k in round_record(strategy.reports[1]).metrics if "personalised" in k]
