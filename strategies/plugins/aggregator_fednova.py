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
``v <- beta v + Delta``, ``x <- x - v``.
"""

from __future__ import annotations

import numpy as np

from strategies.aggregation import fednova_delta
from strategies.registry import AGGREGATORS
from strategies.replies import TrainReply


@AGGREGATORS.register("fednova")
class FedNovaAggregator:
    """Normalised averaging with optional server momentum ``beta``."""


    def __init__(self, server_momentum: float = 0.0) -> None:
        if not 0.0 <= server_momentum < 1.0:
            raise ValueError(f"server momentum must be in [0, 1), got {server_momentum}")
        self.server_momentum = server_momentum
        self._velocity: list[np.ndarray] | None = None

    def aggregate(self, replies: list[TrainReply]) -> tuple[list[np.ndarray], dict[str, float]]:
        """Return the aggregated update and ``tau-eff``."""
        a_norms = [r.a_norm for r in replies]
        n = np.array([r.num_examples for r in replies], dtype=np.float64)
        tau_eff = float(np.dot(n / n.sum(), a_norms))
        delta = fednova_delta([r.delta for r in replies], [r.num_examples for r in replies],
                              a_norms)
        if self.server_momentum > 0.0:
            if self._velocity is None:
                self._velocity = [np.zeros_like(d, dtype=np.float64) for d in delta]
            for v, d in zip(self._velocity, delta):
                if np.issubdtype(d.dtype, np.floating):
                    v *= self.server_momentum
                    v += d
            delta = [v.astype(d.dtype) if np.issubdtype(d.dtype, np.floating) else d
                     for v, d in zip(self._velocity, delta)]
        return delta, {"tau-eff": tau_eff}
