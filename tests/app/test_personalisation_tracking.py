"""Issue 16 on the server: evaluate instructions name the federation, and MLflow's round
record holds each site's personalised metric and its difference to the global one."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message

from app.engine import InProcessGrid, VirtualSite
from app.tracking.tracker import round_record
from strategies.plugins.registries import AGGREGATORS, SCHEDULES, SELECTORS
from strategies.rounds.federated_strategy import FederatedStrategy
from strategies.wire import message_keys as keys
from tests.fixtures.scripted_site import ScriptedSite

pytestmark = pytest.mark.usefixtures("server_identity")


def _evaluated(replies: dict[str, dict]) -> tuple[FederatedStrategy, list[Message]]:
    """One evaluate exchange with sites named as ``replies``' keys, answering their metrics."""
    received: list[Message] = []

    def site(name: str) -> ScriptedSite:
        metrics = dict(replies[name])
        scripted = ScriptedSite(name, num_examples=int(metrics.pop(keys.NUM_EXAMPLES)),
                                evaluate=lambda _weights: metrics)

        def answer(message: Message, context: Context) -> Message:
            received.append(message)
            return scripted(message, context)

        return answer

    grid = InProcessGrid([VirtualSite({}, site(name)) for name in replies], run_id=42)
    strategy = FederatedStrategy(aggregator=AGGREGATORS.create("fedavg"),
                                 schedule=SCHEDULES.create("fixed", tau0=2),
                                 selector=SELECTORS.create("uniform"), min_nodes=2,
                                 node_wait_timeout=1, federation="fed-7")
    messages = strategy.configure_evaluate(1, ArrayRecord([np.zeros(2, np.float32)]),
                                           ConfigRecord(), grid)
    strategy.aggregate_evaluate(1, grid.send_and_receive(messages))
    return strategy, received


def test_evaluate_instructions_carry_the_federation():
    _, messages = _evaluated({"h1": {keys.NUM_EXAMPLES: 1}, "h2": {keys.NUM_EXAMPLES: 1}})
    assert [m.content[keys.CONFIG][keys.FEDERATION] for m in messages] == ["fed-7", "fed-7"]


def test_personalised_metrics_and_their_gain_reach_the_round_record():
    strategy, _ = _evaluated({
        "h1": {keys.NUM_EXAMPLES: 10, "val-auc": 0.5, "personalised-val-auc": 0.75},
        "h2": {keys.NUM_EXAMPLES: 30, "val-auc": 0.25, "personalised-val-auc": 0.5}})
    metrics = round_record(strategy.reports[1]).metrics
    assert metrics["site/h1/personalised-val-auc"] == 0.75
    assert metrics["site/h1/personalised-gain-val-auc"] == 0.25
    assert metrics["site/h2/personalised-gain-val-auc"] == 0.25
    assert metrics["eval/personalised-val-auc"] == pytest.approx(0.5625)
    assert metrics["eval/personalised-gain-val-auc"] == pytest.approx(0.25)


def test_without_personalisation_no_personalised_metric_is_logged():
    strategy, _ = _evaluated({"h1": {keys.NUM_EXAMPLES: 10, "val-auc": 0.5},
                              "h2": {keys.NUM_EXAMPLES: 30, "val-auc": 0.25}})
    assert not [k for k in round_record(strategy.reports[1]).metrics if "personalised" in k]
