"""Best-round selection and early stopping on the task's main validation metric.

Round ``r``'s global model is the one its sites evaluated in round ``r``
(:meth:`FederatedStrategy.start` evaluates the new model after aggregating), so
the sites' ``val-<metric>`` of round ``r`` score round ``r``'s arrays: the best
round is the one with the highest score (Dice and ROC AUC are better when
higher). A round no site evaluated neither improves nor counts toward patience.
A round scored NaN (or infinite) is never selected, not even from a checkpoint.

The rule (run config ``best-round.aggregate``, :func:`score_rule`): ``auto`` (the
default) is ``site-vote`` (:mod:`strategies.site_vote`): a round replaces the best so
far when it is better at more of the sites that scored both rounds than it is worse
at (ties: the median paired difference). Every honest site counts, and one site,
lying in range or not, moves one vote (issue 50, item 5: the sites' median of 3 values
was one hospital's and registered round 1 of the heart-disease hospitals in 5 of 5
seeds). A site value out of its metric's range (AUC or Dice outside [0, 1],
:func:`strategies.rounds.reply_intake.range_problem`; the reply intake drops those
replies already) is left out with a warning naming the site, a NaN one (an AUC
undefined on one class) is left out of that round. The older rules stay: ``mean``,
the example-weighted mean ``RoundReport.evaluate_aggregate`` (one site reporting
0.99 decides it); ``median`` or ``trimmed-mean``, unweighted robust rules over the
sites' finite values (:mod:`strategies.robust`; with 3 sites both are one site's
value). The counts are not used by the vote on purpose: they are self-reported too.

The best value (:attr:`BestRound.value`, logged as ``best-<metric>`` and in the
registered version's tags, printed on the ``New best round`` line) is, under the
site vote, the round's own ``<metric>`` as its round line prints it (the
example-weighted mean; the mean of the sites' valid values when the round has no
finite one), and under the other rules the rule's score; :attr:`BestRound.value_label`
names which. The run's tag ``selection-aggregate`` names the rule.

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
from logging import WARNING
from typing import Any

import numpy as np
from flwr.supercore import log

from strategies.robust import ROBUST_RULES
from strategies.rounds.reply_intake import range_problem
from strategies.site_vote import SITE_VOTE, site_vote

__all__ = ["BestRound", "score_rule"]


def score_rule(choice: str) -> str:
    """The rule run config ``best-round.aggregate = choice`` scores rounds with: ``auto``
    is ``site-vote`` (whatever the defence: the vote is what a hospital would pick and
    robust to one site), any other choice is itself."""
    return SITE_VOTE if choice == "auto" else choice


def valid_values(metric: str, sites: Mapping[str, Mapping[str, float]],
                 server_round: int = 0) -> dict[str, float]:
    """Each site's finite, in-range value of ``metric``; one out of range is left out with a
    warning naming the site (a NaN or missing one silently: the metric is undefined there)."""
    values = {}
    for site, metrics in sorted(sites.items()):
        value = metrics.get(metric)
        if value is None or not math.isfinite(value):
            continue
        problem = range_problem(metric, float(value))
        if problem:
            log(WARNING, "Best round: round %d's value of site %s left out: %s", server_round,
                site, problem)
            continue
        values[site] = float(value)
    return values


class BestRound:
    """The best round so far, its arrays, and the rounds since the last real improvement.

    Parameters
    ----------
    metric : str
        The validation metric that selects, e.g. ``val-dice``.
    patience : int
        Evaluated rounds without an improvement of ``min_delta`` before stopping
        (0 = never stop).
    min_delta : float
        The least gain over the best that counts as an improvement (the site vote: the
        median paired difference; the other rules: the score's rise).
    aggregate : str
        The rule: ``site-vote``, ``mean`` (the round's example-weighted aggregate),
        ``median`` or ``trimmed-mean`` (:func:`score_rule` resolves run config ``auto``).
    """

    def __init__(self, metric: str, patience: int = 0, min_delta: float = 0.0,
                 aggregate: str = "mean") -> None:
        self.metric, self.patience, self.min_delta = metric, patience, min_delta
        self.aggregate = aggregate
        self.round = 0
        self.value = -math.inf
        self.sites: list[str] = []
        self.site_values: dict[str, float] = {}
        self.keys: list[str] = []
        self.arrays: list[np.ndarray] = []
        self.stale = 0
        self.reason = ""

    @property
    def found(self) -> bool:
        """Whether any round was evaluated."""
        return self.round > 0

    @property
    def exhausted(self) -> bool:
        """Whether early stopping asks to stop now."""
        return 0 < self.patience <= self.stale

    @property
    def value_label(self) -> str:
        """What :attr:`value` is: ``the round's value`` (the site vote, the mean) or the
        rule's score (``median of 3 sites``)."""
        if self.aggregate in (SITE_VOTE, "mean"):
            return "the round's value"
        return f"{self.aggregate} of {len(self.site_values)} sites"

    def score(self, evaluated: Mapping[str, float],
              sites: Mapping[str, Mapping[str, float]]) -> float | None:
        """A round's value: ``evaluated[metric]`` (``mean``, ``site-vote``; the site vote
        falls back to the mean of the sites' valid values when that is not finite) or the
        robust rule over the sites' finite values (``None``: no site released one)."""
        if self.aggregate == "mean":
            return evaluated.get(self.metric)
        values = list(valid_values(self.metric, sites).values())
        if self.aggregate == SITE_VOTE:
            value = evaluated.get(self.metric)
            if value is not None and math.isfinite(value):
                return float(value)
            return float(np.mean(values)) if values else None
        return ROBUST_RULES.get(self.aggregate)(values) if values else None

    def _compare(self, server_round: int, value: float,
                 values: Mapping[str, float]) -> tuple[bool, float]:
        """Whether round ``server_round`` (its ``value``, its sites' valid ``values``) beats
        the best so far, and by how much (the gain ``min_delta`` is compared with)."""
        if self.aggregate != SITE_VOTE:
            return value > self.value, value - self.value
        if not self.found:
            self.reason = f"rule site-vote: the first round scored, at {len(values)} sites"
            return True, math.inf
        vote = site_vote(values, self.site_values)
        if vote.sites == 0:  # no site scored both (an older checkpoint, disjoint samples)
            improved = value > self.value
            self.reason = (f"rule site-vote: no site scored both it and round {self.round}, "
                           "the rounds' values compared")
            return improved, value - self.value
        self.reason = f"rule site-vote: {vote.text(self.round)}"
        return vote.wins, vote.gain

    def observe(self, server_round: int, evaluated: Mapping[str, float],
                sites: Mapping[str, Mapping[str, float]], keys: list[str],
                arrays: list[np.ndarray]) -> bool:
        """Score round ``server_round`` (its aggregate ``evaluated`` metrics, the metrics of
        the ``sites`` that evaluated, by site, its global ``arrays``, :meth:`score`);
        ``True`` when it is the new best (:attr:`reason` says why under the site vote)."""
        value = self.score(evaluated, sites)
        if value is None or not math.isfinite(value):
            return False
        values = valid_values(self.metric, sites, server_round)
        if self.aggregate == SITE_VOTE and not values:
            return False
        improved, gain = self._compare(server_round, value, values)
        if improved and gain >= self.min_delta:
            self.stale = 0
        else:
            self.stale += 1
        if improved:
            self.round, self.value, self.sites = server_round, float(value), sorted(sites)
            self.site_values = dict(values)
            self.keys, self.arrays = list(keys), [np.array(a, copy=True) for a in arrays]
        return improved

    def line(self) -> str:
        """The ``New best round`` line: ``New best round 4: val-auc 0.8123 (the round's
        value); rule site-vote: better at 2, worse at 1 of the 3 sites ...``."""
        text = f"New best round {self.round}: {self.metric} {self.value:.4f} ({self.value_label})"
        return f"{text}; {self.reason}" if self.aggregate == SITE_VOTE else text

    def state(self) -> dict[str, Any]:
        """Plain values and arrays for the checkpoint (:func:`encode_tree`)."""
        return {"metric": self.metric, "round": self.round, "value": self.value,
                "sites": list(self.sites), "site-values": dict(self.site_values),
                "keys": list(self.keys), "arrays": list(self.arrays), "stale": self.stale}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state` (an empty one, from an older checkpoint, changes
        nothing; a best round scored NaN or infinite is dropped: never selected; one
        without ``site-values``, older, is compared on its value)."""
        if not state:
            return
        self.stale = int(state["stale"])
        if not math.isfinite(float(state["value"])):
            return
        self.round, self.value = int(state["round"]), float(state["value"])
        self.sites, self.keys = list(state["sites"]), list(state["keys"])
        self.site_values = {str(k): float(v) for k, v in state.get("site-values", {}).items()}
        self.arrays = [np.asarray(a) for a in state["arrays"]]
