"""Every metric a site of the product sends, with its range: ONE table, read at both ends.

A site chooses its reply, metrics included. One site reporting ``val-auc = 1e6``
next to 0.70 and 0.72 made the federation's example-weighted AUC 333,333.8 and
picked the round registered as the best model (issue #29); a metric is also a
channel out of the hospital: a name or a value the product never sends can carry
anything (issue #44). :data:`DECLARED` is therefore the one list of the metric
names the product's sites send, each with its range, and both ends read it:

* the server (:func:`strategies.replies.parse_metrics_reply` and ``parse_train_reply``)
  drops a reply whose metric is out of its range (:func:`range_problem`), and still
  accepts a name the table does not declare (it only has to be finite);
* the hospital's site runtime (:mod:`app.site_runtime.egress_filter`) refuses a reply
  that carries an undeclared name (:func:`declared`) or a value out of range.

The names (:mod:`strategies.wire.message_keys`, :mod:`clients.site.site_round`'s
``<split>-<name>``, personalisation's ``personalised-<split>-<name>``, the vertical
stages' own, the tasks' ``main_metric`` and metrics, :data:`TASK_METRICS`):

* rates in [0, 1] -- ``<split>-<metric>`` for the tasks' metrics (``val-dice``,
  ``test-auc``), after ``personalised-``, ``local-`` or ``pvfed-``;
* losses >= 0 -- ``train-loss``, ``initial-loss``, ``query-loss``, ``encoder-loss``,
  ``[personalised-]<split>-loss``;
* counts, whole numbers >= 0 -- ``num-examples``, ``steps``, ``studies-skipped``,
  ``<split>-studies``, ``<split>-examples``, ``psi-size``, ``patients``,
  ``feature-width``, ``head-inputs`` and the acknowledged versions
  ``downlink-version``, ``pruning-version``;
* durations and norms >= 0 -- ``train-seconds``, ``residual-norm``;
* privacy -- ``epsilon`` and ``epsilon-left`` >= 0, ``epsilon-round`` finite (an
  increase, which concurrent computations settling meanwhile can make slightly
  negative).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from strategies.wire import message_keys as keys

__all__ = ["DECLARED", "MetricRange", "SPLITS", "TASK_METRICS", "declared", "range_problem"]


@dataclass(frozen=True)
class MetricRange:
    """The interval ``[low, high]`` a metric's finite value must lie in, and its rule in words.

    ``whole``: the value must also be a whole number (a count).
    """

    low: float
    high: float
    rule: str
    whole: bool = False

    def holds(self, value: float) -> bool:
        """Whether ``value`` is finite, lies in ``[low, high]`` and is whole when it must be."""
        return (math.isfinite(value) and self.low <= value <= self.high
                and (not self.whole or value == int(value)))


#: The evaluation splits a metric name starts with (``val-dice``, ``test-auc``).
SPLITS = keys.EVAL_SPLITS
#: The tasks' evaluation metrics (their ``main_metric`` and ``EvalResult.metrics`` names:
#: Dice for pe-seg, ROC AUC and accuracy for the classifiers); all rates.
TASK_METRICS = ("auc", "dice", "accuracy")

_SPLIT = "|".join(SPLITS)
_RATES = "|".join(TASK_METRICS)
_COUNTS = (keys.NUM_EXAMPLES, keys.STEPS, keys.STUDIES_SKIPPED, "psi-size", "patients",
           "feature-width", "head-inputs", keys.DOWNLINK_VERSION, keys.PRUNING_VERSION)
_LOSSES = (keys.TRAIN_LOSS, keys.INITIAL_LOSS, keys.QUERY_LOSS, "encoder-loss")


def _names(names: tuple[str, ...]) -> str:
    return "|".join(re.escape(name) for name in names)


#: Metric-name pattern (a full match) -> its range; a name matches at most one pattern.
DECLARED: tuple[tuple[re.Pattern[str], MetricRange], ...] = (
    (re.compile(rf"(?:(?:personalised|local|pvfed)-)?(?:{_SPLIT})-(?:{_RATES})"),
     MetricRange(0.0, 1.0, "AUC, Dice and accuracy are rates in [0, 1]")),
    (re.compile(rf"{_names(_LOSSES)}|(?:personalised-)?(?:{_SPLIT})-loss"),
     MetricRange(0.0, math.inf, "losses are finite and >= 0")),
    (re.compile(rf"{_names(_COUNTS)}|(?:{_SPLIT})-(?:studies|examples)"),
     MetricRange(0.0, math.inf, "counts are >= 0 and whole numbers", whole=True)),
    (re.compile(_names((keys.TRAIN_SECONDS, keys.RESIDUAL_NORM))),
     MetricRange(0.0, math.inf, "durations and norms are >= 0")),
    (re.compile(_names((keys.EPSILON, keys.EPSILON_LEFT))),
     MetricRange(0.0, math.inf, "a privacy budget's epsilon is >= 0")),
    (re.compile(re.escape(keys.EPSILON_ROUND)),
     MetricRange(-math.inf, math.inf, "a computation's epsilon increase is finite")),
)


def declared(name: str) -> MetricRange | None:
    """The range of the declared metric ``name``; ``None`` when the product sends no such name."""
    for pattern, allowed in DECLARED:
        if pattern.fullmatch(name):
            return allowed
    return None


def range_problem(name: str, value: float) -> str | None:
    """Why ``value`` is out of range for the metric ``name`` (``None``: it is in range,
    or the table declares no such name), naming the metric, the value and the rule."""
    allowed = declared(name)
    if allowed is None or allowed.holds(value):
        return None
    return f"metric '{name}' = {value:g} is out of range: {allowed.rule}"
