"""The one table of the metrics sites send (issue #44): every name the product's sites build
is declared with its range, nothing else is, and the server's range check reads the same
table (an undeclared name still passes there, as before)."""

from __future__ import annotations

import math

import pytest

from clients.registry import TASKS, task_class
from strategies.rounds.reply_intake import DECLARED, SPLITS, TASK_METRICS, declared, range_problem
from strategies.wire import message_keys as keys

#: The metric names of the wire contract a site sends.
SENT_KEYS = (keys.NUM_EXAMPLES, keys.STEPS, keys.TRAIN_LOSS, keys.INITIAL_LOSS,
             keys.TRAIN_SECONDS, keys.STUDIES_SKIPPED, keys.RESIDUAL_NORM, keys.EPSILON,
             keys.EPSILON_ROUND, keys.EPSILON_LEFT, keys.VAL_LOSS, keys.VAL_STUDIES,
             keys.TEST_LOSS, keys.TEST_STUDIES, keys.QUERY_LOSS, keys.DOWNLINK_VERSION,
             keys.PRUNING_VERSION)


def test_every_metric_key_a_site_sends_is_declared():
    assert [name for name in SENT_KEYS if declared(name) is None] == []


@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_tasks_main_metric_is_a_declared_rate_per_split(task):
    metric = task_class(task).main_metric
    assert metric in TASK_METRICS
    for split in SPLITS:
        for name in (f"{split}-{metric}", f"personalised-{split}-{metric}"):
            allowed = declared(name)
            assert allowed is not None and (allowed.low, allowed.high) == (0.0, 1.0)


@pytest.mark.parametrize("name", [
    keys.A_NORM, "patient-0042", "val-custom-score", "train-dice", "personalised-val-studies",
    "val-auc-2", "epsilon-total", "secagg-summed"])
def test_names_no_site_sends_are_undeclared(name):
    assert declared(name) is None and range_problem(name, -1e9) is None


def test_a_name_matches_one_pattern_at_most():
    for name in (*SENT_KEYS, "val-dice", "pvfed-test-auc", "psi-size", "test-examples"):
        assert sum(bool(pattern.fullmatch(name)) for pattern, _ in DECLARED) == 1, name


@pytest.mark.parametrize(("name", "value", "problem"), [
    ("num-examples", 2.5, True), ("head-inputs", 36, False), ("psi-size", -1, True),
    ("epsilon-round", -1e-12, False), ("epsilon", -0.1, True), ("encoder-loss", math.inf, True),
    ("local-test-auc", 1.0, False), ("pvfed-val-auc", 1.01, True)])
def test_declared_ranges(name, value, problem):
    assert (range_problem(name, value) is not None) == problem
