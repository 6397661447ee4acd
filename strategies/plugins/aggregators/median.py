"""Coordinate-wise median of the updates (``strategy.aggregator = "median"``).

Yin, Chen, Ramchandran, Bartlett, *Byzantine-Robust Distributed Learning:
Towards Optimal Statistical Rates*, ICML 2018, Def. 1: per coordinate, the
median of the sites' values (:func:`strategies.robust.coordinate_median`);
breakdown point 1/2. Unweighted, as in the paper, so a self-reported example
count buys no weight. Integer buffers get the same rule, rounded.

Memory: needs every update of the round at once. Beyond the ``n`` decoded
updates the round holds (``n`` = replies accepted, at most the selected count
``selection.m``), it stacks one array position at a time in float64: ``8 n``
bytes per entry of the model's largest array. Peak server memory is so about
``n x`` (model in its dtype) ``+ 8 n x`` (largest array), linear in the
selected count and independent of the number of connected sites.
"""

from __future__ import annotations

import numpy as np

from strategies.plugins.registries import AGGREGATORS
from strategies.rounds.reply_intake import TrainReply
from strategies.robust import coordinate_median, coordinatewise
from strategies.wire.plugin_options import Plugin


@AGGREGATORS.register("median")
class MedianAggregator(Plugin):
    """Coordinate-wise median of the replies' updates (no options)."""

    #: Not linear: every update of the round is held until the aggregation,
    #: bounded by run config ``round.max-held-mb`` (:mod:`strategies.rounds.update_stream`).
    needs_all_updates = True

    def update_scale(self, reply: TrainReply) -> float:
        """Each update enters the aggregate as it is."""
        return 1.0

    def aggregate(self, replies: list[TrainReply]) -> tuple[list[np.ndarray], dict[str, float]]:
        """Return the coordinate-wise median of the updates."""
        return coordinatewise([r.delta for r in replies], coordinate_median), {}
