"""FedAvg aggregation of site updates (McMahan et al., AISTATS 2017).

``Delta = sum_i p_i delta_i`` with ``p_i = n_i / sum_j n_j`` over the accepted
replies, always computed by one fold (:func:`strategies.aggregation.fedavg_fold`):
``S = sum_i n_i delta_i``, then ``Delta = S / sum_i n_i``
(:func:`strategies.aggregation.fedavg_finish`). Linear, so it streams
(:mod:`strategies.rounds.update_stream`): each reply is folded as it arrives
(:meth:`FedAvgAggregator.fold`, :meth:`FedAvgAggregator.finish`), so the server
holds one float64 sum, not every update; a set held behind a defence that needs
all of them is folded the same way (:meth:`FedAvgAggregator.aggregate`,
:func:`strategies.aggregation.fedavg_delta`); the same :meth:`FedAvgAggregator.finish`
makes a SecAgg+ round's update of its unmasked sum ``S`` (of ``r S``,
:class:`~strategies.plugins.protocols.SecureSumAggregator`).
"""

from __future__ import annotations

import numpy as np

from strategies.aggregation import RunningSum, fedavg_delta, fedavg_finish, fedavg_fold
from strategies.plugins.registries import AGGREGATORS
from strategies.rounds.reply_intake import TrainReply
from strategies.wire.plugin_options import Plugin


@AGGREGATORS.register("fedavg")
class FedAvgAggregator(Plugin):
    """Example-weighted average of the updates (no options)."""

    #: Linear: the round's replies are folded into a running sum as they arrive.
    needs_all_updates = False

    def update_scale(self, reply: TrainReply) -> float:
        """Each update enters the aggregate as it is."""
        return 1.0

    def secure_a_floor(self, tau_a_norm: float) -> float:
        """0: under SecAgg+ each site weighs its update by its size alone, ``min(1, n_i / r)``."""
        return 0.0

    def aggregate(self, replies: list[TrainReply]) -> tuple[list[np.ndarray], dict[str, float]]:
        """Return the aggregated update and info to track."""
        delta = fedavg_delta([r.delta for r in replies], [r.num_examples for r in replies])
        return delta, {}

    def fold(self, total: RunningSum, reply: TrainReply, index: int) -> dict[str, float]:
        """``S += n_i delta_i`` (``index``: the reply's position, for the error message)."""
        fedavg_fold(total, reply.delta, reply.num_examples, index)
        return {}

    def finish(self, total: RunningSum,
               replies: list[TrainReply]) -> tuple[list[np.ndarray], dict[str, float]]:
        """``Delta = S / sum_i n_i`` over the folded ``replies``."""
        return fedavg_finish(total, float(sum(r.num_examples for r in replies))), {}
