"""Site metrics are range-checked per metric when a reply is parsed (issue #29, found 5).

``val-auc`` reported as 0.70, 0.72 and 1e6 aggregated to 333,333.8, and that one
site picked the best round. Now AUC, Dice and accuracy-like rates must lie in
[0, 1], losses be finite and >= 0, counts >= 0: a reply outside its metric's
range is dropped with the metric, the value and the rule, never aggregated.
"""

from __future__ import annotations

from functools import partial

import pytest
from flwr.app import ConfigRecord

from strategies.rounds.reply_intake import InvalidReplyError, parse_metrics_reply, range_problem
from strategies.wire import message_keys as keys
from tests.strategies.scripted_grid import scripted_grid
from tests.strategies.test_federated_strategy import (
    GLOBAL, _global_record, _reply, _train_metrics, make_strategy)
from tests.strategies.test_metrics_replies import _reply as _metrics_reply
from tests.strategies.test_trust_boundary import _delta, _round

pytestmark = pytest.mark.usefixtures("server_identity")


def _evaluate(strategy, answers: dict[int, tuple[str, dict]]):
    """An evaluate round; ``answers[node] = (site, metrics)``."""
    grid = scripted_grid({node: partial(lambda m, a: _reply(m, None, a[1], a[0]), a=answer)
                          for node, answer in answers.items()})
    messages = strategy.configure_evaluate(1, _global_record(), ConfigRecord(), grid)
    return strategy.aggregate_evaluate(1, grid.send_and_receive(messages, timeout=5.0))


def test_one_site_reporting_an_auc_of_a_million_is_dropped_not_averaged():
    strategy = make_strategy(min_nodes=3)
    metrics = _evaluate(strategy, {
        8: ("a", {keys.NUM_EXAMPLES: 10, "val-auc": 0.70}),
        2: ("b", {keys.NUM_EXAMPLES: 10, "val-auc": 0.72}),
        3: ("c", {keys.NUM_EXAMPLES: 10, "val-auc": 1e6})})
    assert metrics["val-auc"] == pytest.approx(0.71)
    report = strategy.reports[1]
    assert sorted(report.evaluate) == ["a", "b"]
    assert report.evaluate_dropped["c"] == (
        "metric 'val-auc' = 1e+06 is out of range: AUC, Dice and accuracy are rates in [0, 1]")


def test_a_train_reply_with_a_negative_loss_is_dropped_naming_the_rule():
    strategy = make_strategy(min_nodes=2)
    arrays, _ = _round(strategy, 1, [8, 2], {
        8: (_delta(1.0), _train_metrics(10), "a"),
        2: (_delta(-1.0), _train_metrics(10, loss=-3.0), "b")})
    assert arrays.to_numpy_ndarrays()[0] == pytest.approx(GLOBAL[0] - 1.0)
    assert strategy.reports[1].train_dropped["b"] == (
        "metric 'train-loss' = -3 is out of range: losses are finite and >= 0")


@pytest.mark.parametrize(("name", "value", "rule"), [
    ("val-dice", 1.5, "[0, 1]"), ("test-accuracy", -0.1, "[0, 1]"),
    ("personalised-val-auc", 2.0, "[0, 1]"), ("val-loss", -1e-3, ">= 0"),
    ("initial-loss", -2.0, ">= 0"), ("query-loss", -1.0, ">= 0"),
    ("val-studies", -1.0, "counts are >= 0"), ("studies-skipped", -4.0, "counts are >= 0"),
    ("train-seconds", -5.0, ">= 0")])
def test_each_metric_of_the_product_has_its_range(name, value, rule):
    assert rule in range_problem(name, value)
    with pytest.raises(InvalidReplyError, match=f"metric '{name}' = .* is out of range"):
        parse_metrics_reply(_metrics_reply({keys.NUM_EXAMPLES: 4, name: value}))


@pytest.mark.parametrize(("name", "value"), [
    ("val-auc", 0.0), ("val-dice", 1.0), ("val-loss", 0.0), ("train-loss", 12.5),
    ("num-examples", 0.0), ("val-custom-score", -7.0), ("epsilon-round", -1e-12)])
def test_values_in_range_and_unknown_metrics_pass(name, value):
    assert range_problem(name, value) is None
