"""Coordinate-wise trimmed mean of the updates (``strategy.aggregator = "trimmed-mean"``).

Yin, Chen, Ramchandran, Bartlett, *Byzantine-Robust Distributed Learning:
Towards Optimal Statistical Rates*, ICML 2018, Def. 2: per coordinate, drop
the ``b = floor(beta * n)`` largest and smallest values and average the rest
(:func:`strategies.robust.trimmed_mean`). Unweighted, as in the paper: a
site's self-reported example count does not decide what is trimmed, so it
cannot buy weight. Integer buffers get the same rule, rounded. Tracked per
round: ``trimmed-per-end`` (``b``; 0 means a plain mean: raise ``beta`` or the
number of sites, ``b >= 1`` needs ``n >= 1 / beta``).

Memory: needs every update of the round at once, like the median: the ``n``
decoded updates (``n`` <= the selected count ``selection.m``) plus one float64
stack of ``n`` x (the model's largest array) at a time; linear in the selected
count, independent of the number of connected sites.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strategies.plugins.registries import AGGREGATORS
from strategies.rounds.reply_intake import TrainReply
from strategies.robust import coordinatewise, trimmed_count, trimmed_mean
from strategies.wire.plugin_options import Plugin, PluginOptions, option


@dataclass(frozen=True)
class TrimmedMeanOptions(PluginOptions):
    """Run-config section ``trimmed-mean``.

    Attributes
    ----------
    beta : float
        ``trimmed-mean.beta``: fraction of the values cut at each end, in [0, 0.5).
    """

    section = "trimmed-mean"
    beta: float = option(0.2, at_least=0.0, below=0.5)


@AGGREGATORS.register("trimmed-mean")
class TrimmedMeanAggregator(Plugin):
    """Coordinate-wise beta-trimmed mean of the replies' updates."""

    Options = TrimmedMeanOptions
    #: Not linear: every update of the round is held until the aggregation,
    #: bounded by run config ``round.max-held-mb`` (:mod:`strategies.rounds.update_stream`).
    needs_all_updates = True

    def __init__(self, beta: float = 0.2) -> None:
        self.beta = TrimmedMeanOptions(beta=beta).beta

    def update_scale(self, reply: TrainReply) -> float:
        """Each update enters the aggregate as it is."""
        return 1.0

    def aggregate(self, replies: list[TrainReply]) -> tuple[list[np.ndarray], dict[str, float]]:
        """Return the trimmed mean of the updates and ``trimmed-per-end``."""
        delta = coordinatewise([r.delta for r in replies],
                               lambda stack: trimmed_mean(stack, self.beta))
        return delta, {"trimmed-per-end": float(trimmed_count(len(replies), self.beta))}
