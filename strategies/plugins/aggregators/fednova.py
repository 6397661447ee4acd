"""FedNova: normalised averaging that removes objective inconsistency.

Wang, Liu, Liang, Joshi, Poor, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020, eq. (6)-(7):
``x_{r+1} = x_r - tau_eff * sum_i p_i delta_i / ||a_i||_1`` with
``tau_eff = sum_i p_i ||a_i||_1`` and ``p_i = n_i / sum_j n_j`` over the replies
received (:func:`strategies.aggregation.fednova_delta`). ``||a_i||_1`` is
computed by the server from the steps the site reports and the run's local
solver (:class:`strategies.local_solver.LocalSolver`, ``TrainReply.a_norm``),
never taken from the site, so partial work at a deadline is normalised
correctly and a site cannot inflate its weight.

Optional server momentum (the paper's FedNova with server-side momentum, Sec. 5):
``v <- beta v + Delta``, ``x <- x - v`` (run config ``fednova.server-momentum``).
Needs ``optimizer = "sgd"`` (:meth:`FedNovaAggregator.requires`).

Linear, so it streams (:mod:`strategies.rounds.update_stream`): each reply is
folded into ``S = sum_i (n_i / ||a_i||_1) delta_i`` as it arrives and, with
``N = sum_i n_i``, ``Delta = (sum_i n_i ||a_i||_1 / N) S / N`` at the end: the same
``tau_eff sum_i p_i delta_i / ||a_i||_1`` (integer buffers: ``sum_i n_i delta_i / N``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strategies.aggregation import RunningSum, fednova_delta, positive_weight
from strategies.plugins.options import Plugin, PluginError, PluginOptions, option
from strategies.plugins.run_settings import RunSettings
from strategies.plugins.registries import AGGREGATORS
from strategies.replies import TrainReply


@dataclass(frozen=True)
class FedNovaOptions(PluginOptions):
    """Run-config section ``fednova``.

    Attributes
    ----------
    server_momentum : float
        ``fednova.server-momentum``: server momentum beta in [0, 1); 0 = none.
    """

    section = "fednova"
    server_momentum: float = option(0.0, at_least=0.0, below=1.0)


@AGGREGATORS.register("fednova")
class FedNovaAggregator(Plugin):
    """Normalised averaging with optional server momentum ``beta``."""

    Options = FedNovaOptions
    #: Linear: the round's replies are folded into a running sum as they arrive.
    needs_all_updates = False

    def __init__(self, server_momentum: float = 0.0) -> None:
        self.server_momentum = FedNovaOptions(server_momentum=server_momentum).server_momentum
        self._velocity: list[np.ndarray] | None = None

    @staticmethod
    def requires(options: FedNovaOptions, settings: RunSettings) -> None:
        """FedNova's solver norm ``||a_i||_1`` is defined for SGD-type local solvers only."""
        if settings.optimizer != "sgd":
            raise PluginError(
                "run config key 'strategy.aggregator' = 'fednova' needs optimizer = \"sgd\": "
                "its solver norm ||a||_1 is defined for SGD, heavy-ball momentum and "
                "proximal local solvers (Wang et al. 2020), not Adam; got optimizer = "
                f"{settings.optimizer!r}")

    def aggregate(self, replies: list[TrainReply]) -> tuple[list[np.ndarray], dict[str, float]]:
        """Return the aggregated update and ``tau-eff``."""
        a_norms = [r.a_norm for r in replies]
        n = np.array([r.num_examples for r in replies], dtype=np.float64)
        tau_eff = float(np.dot(n / n.sum(), a_norms))
        delta = fednova_delta([r.delta for r in replies], [r.num_examples for r in replies],
                              a_norms)
        return self._with_momentum(delta), {"tau-eff": tau_eff}

    def fold(self, total: RunningSum, reply: TrainReply, index: int) -> dict[str, float]:
        """``S += (n_i / ||a_i||_1) delta_i`` on float arrays, ``n_i delta_i`` on integer ones."""
        n = positive_weight(reply.num_examples, "num_examples", index)
        a_norm = positive_weight(reply.a_norm, "a_norms", index)
        total.add(reply.delta, n / a_norm, n)
        return {}

    def finish(self, total: RunningSum,
               replies: list[TrainReply]) -> tuple[list[np.ndarray], dict[str, float]]:
        """``Delta = tau_eff S / N`` (integers ``S / N``) over the folded replies; ``tau-eff``."""
        count = float(sum(r.num_examples for r in replies))
        tau_eff = sum(r.num_examples * r.a_norm for r in replies) / count
        delta = total.result(tau_eff / count, 1.0 / count)
        return self._with_momentum(delta), {"tau-eff": tau_eff}

    def _with_momentum(self, delta: list[np.ndarray]) -> list[np.ndarray]:
        """``v <- beta v + Delta`` and ``v`` as the update (``Delta`` itself when beta = 0)."""
        if self.server_momentum == 0.0:
            return delta
        if self._velocity is None:
            self._velocity = [np.zeros_like(d, dtype=np.float64) for d in delta]
        for v, d in zip(self._velocity, delta):
            if np.issubdtype(d.dtype, np.floating):
                v *= self.server_momentum
                v += d
        return [v.astype(d.dtype) if np.issubdtype(d.dtype, np.floating) else d
                for v, d in zip(self._velocity, delta)]
