"""FedNova: normalised averaging that removes objective inconsistency.

Wang, Liu, Liang, Joshi, Poor, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020, eq. (6)-(7):
``x_{r+1} = x_r - tau_eff * sum_i p_i delta_i / ||a_i||_1`` with
``tau_eff = sum_i p_i ||a_i||_1`` and ``p_i = n_i / sum_j n_j`` over the replies
received (:func:`strategies.aggregation.fednova_delta`). ``||a_i||_1`` is
computed by the server from the steps the site reports and the run's local
solver (:class:`strategies.wire.local_solver.LocalSolver`, ``TrainReply.a_norm``),
never taken from the site, so partial work at a deadline is normalised
correctly and a site cannot inflate its weight.

Bounded normalisation (#29): a site that reports few steps divides its update by a
small ``||a_i||_1`` and gains weight (1 step of 8 planned: about 8x). The a-norm
counted for a reply is at least ``fednova.min-steps-fraction`` (``f``, in (0, 1],
default 0.5) x the a-norm of the tau it was sent (``TrainReply.tau_a_norm``):
with plain SGD (``||a||_1 = steps``) steps below ``f tau`` count as ``f tau``. A
reply's update thus enters the aggregate with at most ``1 / f`` times the weight of
a full round's (legitimate partial work at a deadline below ``f tau`` is
under-weighted the same way), and the floored a-norm is tracked as
``a-norm-floored/<site>`` with a warning naming the site and the rule. The defence
in front (:mod:`strategies.rounds.update_stream`) measures the update as it
enters the aggregate, ``(tau / ||a_i||_1) delta_i`` (:meth:`FedNovaAggregator.update_scale`),
not ``delta_i``.

Server momentum (the paper's FedNova with server-side momentum, Sec. 5:
``v <- beta v + Delta``, ``x <- x - v``) is the server optimizer's
(``strategy.server-opt = "avgm"``, ``server-opt.momentum = beta``, eta 1:
:mod:`strategies.plugins.server_opt.avgm`), the same step for every aggregator; the
former ``fednova.server-momentum`` is refused naming it (:data:`RETIRED_MOMENTUM`).
Needs ``optimizer = "sgd"`` (:meth:`FedNovaAggregator.requires`).

Linear, so it streams (:mod:`strategies.rounds.update_stream`): each reply is
folded into ``S = sum_i (n_i / ||a_i||_1) delta_i`` as it arrives and, with
``N = sum_i n_i``, ``Delta = (sum_i n_i ||a_i||_1 / N) S / N`` at the end: the same
``tau_eff sum_i p_i delta_i / ||a_i||_1`` (integer buffers: ``sum_i n_i delta_i / N``).
"""

from __future__ import annotations

from dataclasses import dataclass
from logging import WARNING

import numpy as np
from flwr.supercore import log

from strategies.aggregation import RunningSum, fednova_delta, positive_weight
from strategies.plugins.registries import AGGREGATORS
from strategies.plugins.run_settings import RunSettings
from strategies.rounds.reply_intake import TrainReply
from strategies.wire.plugin_options import Plugin, PluginError, PluginOptions, Retired, option


#: ``fednova.server-momentum`` (#45): the heavy-ball step ``strategy.server-opt = "avgm"``
#: takes for every aggregator; 0 was none.
RETIRED_MOMENTUM = Retired(
    0.0, "FedNova's server momentum is the server optimizer's: set strategy.server-opt = "
         "\"avgm\" and server-opt.momentum = <beta> (server-opt.eta 1, its default, is the "
         "same step v <- beta v + Delta, x <- x - v); with 0, drop the key")


@dataclass(frozen=True)
class FedNovaOptions(PluginOptions):
    """Run-config section ``fednova``.

    Attributes
    ----------
    min_steps_fraction : float
        ``fednova.min-steps-fraction``: a reply's a-norm counts at least this
        fraction (in (0, 1]) of the a-norm of the tau it was sent.
    """

    section = "fednova"
    retired = {"server-momentum": RETIRED_MOMENTUM}
    min_steps_fraction: float = option(0.5, at_least=0.0)

    def check(self) -> None:
        """The fraction lies in (0, 1]."""
        if not 0.0 < self.min_steps_fraction <= 1.0:
            self.fail("min_steps_fraction", "must be in (0, 1] (1: every reply counts as a "
                                            "full round)")


@AGGREGATORS.register("fednova")
class FedNovaAggregator(Plugin):
    """Normalised averaging (Wang et al. 2020, eq. (6)-(7)); momentum is the server optimizer's."""

    Options = FedNovaOptions
    #: Linear: the round's replies are folded into a running sum as they arrive.
    needs_all_updates = False
    #: Attributes an older checkpoint holds: skipped at restore while neutral (the
    #: momentum of ``fednova.server-momentum`` 0; :mod:`strategies.rounds.checkpoint`).
    retired_state = {"server_momentum": 0.0, "_velocity": None}

    def __init__(self, min_steps_fraction: float = 0.5) -> None:
        self.min_steps_fraction = FedNovaOptions(
            min_steps_fraction=min_steps_fraction).min_steps_fraction

    @staticmethod
    def requires(options: FedNovaOptions, settings: RunSettings) -> None:
        """FedNova's solver norm ``||a_i||_1`` is defined for SGD-type local solvers only."""
        if settings.optimizer != "sgd":
            raise PluginError(
                "run config key 'strategy.aggregator' = 'fednova' needs optimizer = \"sgd\": "
                "its solver norm ||a||_1 is defined for SGD, heavy-ball momentum and "
                "proximal local solvers (Wang et al. 2020), not Adam; got optimizer = "
                f"{settings.optimizer!r}")

    def counted_a_norm(self, reply: TrainReply) -> float:
        """``max(||a_i||_1, f ||a(tau)||_1)``: the reply's a-norm, at least the fraction
        ``f`` of the a-norm of the tau it was sent (its own when that is unknown)."""
        return max(reply.a_norm, self.min_steps_fraction * reply.tau_a_norm)

    def update_scale(self, reply: TrainReply) -> float:
        """``||a(tau)||_1 / counted a-norm``: the update as it enters the aggregate,
        ``tau_eff p_i delta_i / ||a_i||_1``, next to a full round's (1 when tau is unknown)."""
        counted = self.counted_a_norm(reply)
        return reply.tau_a_norm / counted if reply.tau_a_norm > 0.0 and counted > 0.0 else 1.0

    def secure_a_floor(self, tau_a_norm: float) -> float:
        """``a_f = f ||a(tau)||_1``, the floor of :meth:`counted_a_norm`: under SecAgg+ each site
        weighs its update by ``min(1, n_i / r) a_f / max(a_i, a_f)`` before masking."""
        return self.min_steps_fraction * tau_a_norm

    def _floored(self, replies: list[TrainReply]) -> dict[str, float]:
        """``a-norm-floored/<site>`` for each reply whose a-norm was raised, with a warning."""
        info = {}
        for reply in replies:
            counted = self.counted_a_norm(reply)
            if counted > reply.a_norm:
                log(WARNING, "fednova: %s reported %d steps of the tau sent; its a-norm "
                    "counts as %.4g, not %.4g (rule fednova.min-steps-fraction = %g)",
                    reply.site, reply.steps, counted, reply.a_norm, self.min_steps_fraction)
                info[f"a-norm-floored/{reply.site}"] = counted
        return info

    def aggregate(self, replies: list[TrainReply]) -> tuple[list[np.ndarray], dict[str, float]]:
        """Return the aggregated update, ``tau-eff`` and the floored a-norms."""
        a_norms = [self.counted_a_norm(r) for r in replies]
        n = np.array([r.num_examples for r in replies], dtype=np.float64)
        tau_eff = float(np.dot(n / n.sum(), a_norms))
        delta = fednova_delta([r.delta for r in replies], [r.num_examples for r in replies],
                              a_norms)
        return delta, {"tau-eff": tau_eff, **self._floored(replies)}

    def fold(self, total: RunningSum, reply: TrainReply, index: int) -> dict[str, float]:
        """``S += (n_i / ||a_i||_1) delta_i`` on float arrays, ``n_i delta_i`` on integer ones
        (``||a_i||_1``: :meth:`counted_a_norm`); the floored a-norm, if any."""
        n = positive_weight(reply.num_examples, "num_examples", index)
        a_norm = positive_weight(self.counted_a_norm(reply), "a_norms", index)
        total.add(reply.delta, n / a_norm, n)
        return self._floored([reply])

    def finish(self, total: RunningSum,
               replies: list[TrainReply]) -> tuple[list[np.ndarray], dict[str, float]]:
        """``Delta = tau_eff S / N`` (integers ``S / N``) over the folded replies; ``tau-eff``."""
        count = float(sum(r.num_examples for r in replies))
        tau_eff = sum(r.num_examples * self.counted_a_norm(r) for r in replies) / count
        delta = total.result(tau_eff / count, 1.0 / count)
        return delta, {"tau-eff": tau_eff}
