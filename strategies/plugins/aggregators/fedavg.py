"""FedAvg aggregation of site updates (McMahan et al., AISTATS 2017).

``Delta = sum_i p_i delta_i`` with ``p_i = n_i / sum_j n_j`` over the accepted
replies (:func:`strategies.aggregation.fedavg_delta`).
"""

from __future__ import annotations

import numpy as np

from strategies.aggregation import fedavg_delta
from strategies.plugins.options import Plugin
from strategies.registry import AGGREGATORS
from strategies.replies import TrainReply


@AGGREGATORS.register("fedavg")
class FedAvgAggregator(Plugin):
    """Example-weighted average of the updates (no options)."""

    def aggregate(self, replies: list[TrainReply]) -> tuple[list[np.ndarray], dict[str, float]]:
        """Return the aggregated update and info to track."""
        delta = fedavg_delta([r.delta for r in replies], [r.num_examples for r in replies])
        return delta, {}
