"""Coordinate-wise median of the updates (``strategy.aggregator = "median"``).

Yin, Chen, Ramchandran, Bartlett, *Byzantine-Robust Distributed Learning:
Towards Optimal Statistical Rates*, ICML 2018, Def. 1: per coordinate, the
median of the sites' values (:func:`strategies.robust.coordinate_median`);
breakdown point 1/2. Unweighted, as in the paper, so a self-reported example
count buys no weight. Integer buffers get the same rule, rounded.
"""

from __future__ import annotations

import numpy as np

from strategies.plugins.options import Plugin
from strategies.registry import AGGREGATORS
from strategies.replies import TrainReply
from strategies.robust import coordinate_median, coordinatewise


@AGGREGATORS.register("median")
class MedianAggregator(Plugin):
    """Coordinate-wise median of the replies' updates (no options)."""

    def aggregate(self, replies: list[TrainReply]) -> tuple[list[np.ndarray], dict[str, float]]:
        """Return the coordinate-wise median of the updates."""
        return coordinatewise([r.delta for r in replies], coordinate_median), {}
