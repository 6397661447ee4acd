"""Best-round selection and early stopping on the task's main validation metric.

Round ``r``'s global model is the one its sites evaluated in round ``r``
(:meth:`FederatedStrategy.start` evaluates the new model after aggregating), so
the sites' ``val-<metric>`` of round ``r`` score round ``r``'s arrays: the best
round is the one with the highest score (Dice and ROC AUC are better when
higher). A round no site evaluated neither improves nor counts toward patience.
A round scored NaN (or infinite) is never selected, not even from a checkpoint.

The score of a round (run config ``best-round.aggregate``, :func:`score_rule`):
``mean``, the example-weighted mean ``RoundReport.evaluate_aggregate`` (one site
reporting 1e6 or an in-range 0.99 decides it); ``median`` or ``trimmed-mean``,
unweighted robust rules over the sites' finite values
(:mod:`strategies.robust`); ``auto`` (the default), the median
whenever a defence is on (``strategy.defence`` not ``none``, or a robust
aggregator), else the mean. The median ignores the example counts on purpose:
they are self-reported too. The selecting value is the one logged as
``best-<metric>`` and in the registered version's tags; the run's tag
``selection-aggregate`` names the rule.

Early stopping (Prechelt, "Early stopping -- but when?", 1998): stop after
``patience`` evaluated rounds in a row without an improvement of at least
``min_delta`` over the best value so far; ``patience = 0`` never stops. The best
arrays are kept whatever ``min_delta`` says: a smaller gain still selects the
round, it only does not reset the patience.

The state (:meth:`BestRound.state`) goes into the server checkpoint, so a resumed
federation keeps the best model found before the crash.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from strategies.plugins.registries import AGGREGATORS
from strategies.robust import ROBUST_RULES

__all__ = ["BestRound", "score_rule"]


def score_rule(choice: str, defence: str, aggregator: str) -> str:
    """The rule run config ``best-round.aggregate = choice`` scores rounds with.

    ``auto`` is ``median`` behind a defence (``defence`` not ``none``) or a robust
    aggregator (one that is not linear: it needs every update of the round, as the
    median and the trimmed mean do; FedAvg and FedNova, linear, follow any one
    site), else ``mean``; any other choice is itself.
    """
    if choice != "auto":
        return choice
    robust = defence != "none" or AGGREGATORS.get(aggregator).needs_all_updates
    return "median" if robust else "mean"


class BestRound:
    """The best round so far, its arrays, and the rounds since the last real improvement.

    Parameters
    ----------
    metric : str
        The aggregate validation metric that selects, e.g. ``val-dice``.
    patience : int
        Evaluated rounds without an improvement of ``min_delta`` before stopping
        (0 = never stop).
    min_delta : float
        The least gain over the best value that counts as an improvement.
    aggregate : str
        How a round is scored from its sites' values: ``mean`` (the round's
        example-weighted aggregate), ``median`` or ``trimmed-mean``
        (:func:`score_rule` resolves run config ``auto``).
    """

    def __init__(self, metric: str, patience: int = 0, min_delta: float = 0.0,
                 aggregate: str = "mean") -> None:
        self.metric, self.patience, self.min_delta = metric, patience, min_delta
        self.aggregate = aggregate
        self.round = 0
        self.value = -math.inf
        self.sites: list[str] = []
        self.keys: list[str] = []
        self.arrays: list[np.ndarray] = []
        self.stale = 0

    @property
    def found(self) -> bool:
        """Whether any round was evaluated."""
        return self.round > 0

    @property
    def exhausted(self) -> bool:
        """Whether early stopping asks to stop now."""
        return 0 < self.patience <= self.stale

    def score(self, evaluated: Mapping[str, float],
              sites: Mapping[str, Mapping[str, float]]) -> float | None:
        """A round's score: ``evaluated[metric]`` (``mean``) or the robust rule over the
        sites' finite values of the metric (``None``: no site released one)."""
        if self.aggregate == "mean":
            return evaluated.get(self.metric)
        values = [float(m[self.metric]) for m in sites.values()
                  if self.metric in m and math.isfinite(m[self.metric])]
        return ROBUST_RULES.get(self.aggregate)(values) if values else None

    def observe(self, server_round: int, evaluated: Mapping[str, float],
                sites: Mapping[str, Mapping[str, float]], keys: list[str],
                arrays: list[np.ndarray]) -> bool:
        """Score round ``server_round`` (its aggregate ``evaluated`` metrics, the metrics of
        the ``sites`` that evaluated, by site, its global ``arrays``, :meth:`score`);
        ``True`` when it is the new best."""
        value = self.score(evaluated, sites)
        if value is None or not math.isfinite(value):
            return False
        improved = value > self.value
        if improved and value >= self.value + self.min_delta:
            self.stale = 0
        else:
            self.stale += 1
        if improved:
            self.round, self.value, self.sites = server_round, float(value), sorted(sites)
            self.keys, self.arrays = list(keys), [np.array(a, copy=True) for a in arrays]
        return improved

    def state(self) -> dict[str, Any]:
        """Plain values and arrays for the checkpoint (:func:`encode_tree`)."""
        return {"metric": self.metric, "round": self.round, "value": self.value,
                "sites": list(self.sites), "keys": list(self.keys),
                "arrays": list(self.arrays), "stale": self.stale}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state` (an empty one, from an older checkpoint, changes
        nothing; a best round scored NaN or infinite is dropped: never selected)."""
        if not state:
            return
        self.stale = int(state["stale"])
        if not math.isfinite(float(state["value"])):
            return
        self.round, self.value = int(state["round"]), float(state["value"])
        self.sites, self.keys = list(state["sites"]), list(state["keys"])
        self.arrays = [np.asarray(a) for a in state["arrays"]]
