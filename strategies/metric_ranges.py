"""The range of each metric a site reports: one table, checked when a reply is parsed.

A site chooses its reply, metrics included. One site reporting ``val-auc = 1e6``
next to 0.70 and 0.72 made the federation's example-weighted AUC 333,333.8 and
picked the round registered as the best model. Every metric value of a reply
(train, evaluate, query, cross-site) is therefore checked against the rule its
name matches (:data:`RULES`, the first that matches) by
:func:`strategies.replies.parse_metrics_reply` and ``parse_train_reply``; a reply
with a value out of range is dropped with :func:`range_problem`'s reason, never
aggregated.

The names are those the product builds (:mod:`strategies.message_keys`, the
tasks' ``main_metric`` and metrics, :mod:`clients.site.site_round`'s
``<split>-<name>``, personalisation's ``personalised-<split>-<name>``):

* rates -- ``auc``, ``dice``, ``accuracy``, ``sensitivity``, ``specificity``,
  ``precision``, ``recall``, ``f1``, ``iou``, alone or after a prefix
  (``val-auc``, ``personalised-test-dice``): in [0, 1];
* losses -- ``loss`` or ``*-loss`` (``train-loss``, ``initial-loss``,
  ``val-loss``, ``query-loss``): finite and >= 0 (the tasks' BCE and Dice
  losses are);
* counts -- ``num-examples``, ``steps``, ``*-studies``, ``studies-skipped``: >= 0;
* durations and norms -- ``train-seconds``, ``residual-norm``: >= 0.

Any other name (a new task's metric, ``epsilon-round``) only has to be finite,
which :mod:`strategies.replies` checks first for every value.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["RULES", "MetricRange", "range_problem"]


@dataclass(frozen=True)
class MetricRange:
    """The closed interval ``[low, high]`` a metric's value must lie in, and its rule in words."""

    low: float
    high: float
    rule: str

    def holds(self, value: float) -> bool:
        """Whether ``value`` lies in ``[low, high]``."""
        return self.low <= value <= self.high


_RATES = "auc|dice|accuracy|sensitivity|specificity|precision|recall|f1|iou"

#: Metric-name pattern (a full match) -> its range; the first match applies.
RULES: tuple[tuple[re.Pattern[str], MetricRange], ...] = (
    (re.compile(rf"(?:.+-)?(?:{_RATES})"),
     MetricRange(0.0, 1.0, "AUC, Dice, accuracy and sensitivity/specificity-like rates lie "
                           "in [0, 1]")),
    (re.compile(r"(?:.+-)?loss"), MetricRange(0.0, math.inf, "losses are finite and >= 0")),
    (re.compile(r"num-examples|steps|(?:.+-)?studies|studies-skipped"),
     MetricRange(0.0, math.inf, "counts are >= 0")),
    (re.compile(r"train-seconds|residual-norm"),
     MetricRange(0.0, math.inf, "durations and norms are >= 0")),
)


def range_problem(name: str, value: float) -> str | None:
    """Why ``value`` is out of range for the metric ``name`` (``None``: it is in range,
    or no rule names it), naming the metric, the value and the rule."""
    for pattern, allowed in RULES:
        if pattern.fullmatch(name):
            if allowed.holds(value):
                return None
            return f"metric '{name}' = {value:g} is out of range: {allowed.rule}"
    return None
