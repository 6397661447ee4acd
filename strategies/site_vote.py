"""The site vote: is a round better than another at more sites than it is worse?

Best-round selection (``app.tracking.best_round``, run config
``best-round.aggregate = site-vote``, the default through ``auto``) compares each
new round with the best round so far on the sites' own validation values of one
metric (``val-auc``, ``val-dice``), paired site by site: the rounds are compared
on the sites that scored **both** (a site whose value is undefined, NaN, or out
of the metric's range in either round is left out of that comparison only). The
new round wins when it is better at more of those sites than it is worse at:

.. math:: w = |\\{s : v_s(r) > v_s(b)\\}|, \\quad l = |\\{s : v_s(r) < v_s(b)\\}|,
   \\qquad r \\succ b \\iff w > l \\ \\lor\\ (w = l \\land \\tilde d > 0),

with :math:`\\tilde d` the median of the paired differences :math:`v_s(r) - v_s(b)`
(the tie-break, and the gain early stopping compares with ``min-delta``). This is a
pairwise majority (Condorcet) comparison: the round a majority of the hospitals
would pick over the other. Every honest site's value counts (the sites' median of
3 values is one hospital's value, and with a site that reports only in some rounds
the median compares different sets of hospitals), and one site, lying in range or
not, moves one vote of ``w - l`` and cannot move the median difference outside the
honest ones: with 3+ sites it cannot pick a round the others all score worse. No
site's example count is used: counts are self-reported too.

A rank-sum over rounds (Borda) would also bound one site's influence, but the rank of
an earlier round changes when a later one arrives, so the best round could move back
to a round whose arrays are no longer held; the paired vote needs only the best
round's per-site values (checkpointed with it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["SITE_VOTE", "SiteVote", "site_vote"]

#: The rule's run-config name (``best-round.aggregate``).
SITE_VOTE = "site-vote"


@dataclass(frozen=True)
class SiteVote:
    """The outcome of one paired comparison of a round against the best round so far.

    Attributes
    ----------
    better, worse : int
        The sites (among those that scored both rounds) where the round scored higher /
        lower.
    sites : int
        The sites that scored both rounds.
    gain : float
        The median over those sites of the paired differences (NaN: no site scored both).
    """

    better: int
    worse: int
    sites: int
    gain: float

    @property
    def wins(self) -> bool:
        """More sites better than worse, or as many and a positive median difference."""
        return self.better > self.worse or (self.better == self.worse and self.gain > 0)

    def text(self, against: int) -> str:
        """``better at 2, worse at 1 of the 3 sites that scored both it and round 1``."""
        return (f"better at {self.better}, worse at {self.worse} of the {self.sites} sites "
                f"that scored both it and round {against}")


def site_vote(challenger: Mapping[str, float], champion: Mapping[str, float]) -> SiteVote:
    """Compare ``challenger``'s per-site values with ``champion``'s on the sites with a
    finite value in both (see the module)."""
    common = sorted(s for s in challenger if s in champion
                    and math.isfinite(challenger[s]) and math.isfinite(champion[s]))
    differences = np.array([challenger[s] - champion[s] for s in common], np.float64)
    gain = float(np.median(differences)) if common else math.nan
    return SiteVote(int((differences > 0).sum()), int((differences < 0).sum()), len(common),
                    gain)
