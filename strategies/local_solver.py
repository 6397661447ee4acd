"""The sites' local solver as the server knows it, to compute FedNova's a-norm.

FedNova (Wang, Liu, Liang, Joshi, Poor, NeurIPS 2020, eq. (6)-(7)) normalises
each site's update by :math:`\\|a_i\\|_1`, the l1 norm of the coefficients of
the local solver over the :math:`\\tau_i` steps the site actually ran. All sites
run the solver of the run config, so the server computes :math:`\\|a_i\\|_1`
itself from the reported (validated) step count instead of trusting a value a
site sends: a site cannot inflate its weight with an a-norm of ``1e-300``.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.aggregation import AggregationError, local_solver_norm
from strategies.errors import ConfigError

__all__ = ["LocalSolver"]


@dataclass(frozen=True)
class LocalSolver:
    """Local optimiser settings of the run config (the sites' ``task.train``).

    Parameters
    ----------
    optimizer : str
        ``"sgd"`` or ``"adam"``. Adam's adaptive steps have no fixed
        coefficient vector; as on the sites before, it is modelled as plain
        steps (momentum ignored).
    momentum : float
        Heavy-ball momentum :math:`\\rho` (used with ``sgd`` only).
    lr : float
        Local learning rate :math:`\\eta`.
    proximal_mu : float
        FedProx coefficient :math:`\\mu`.
    """

    optimizer: str = "adam"
    momentum: float = 0.0
    lr: float = 0.0
    proximal_mu: float = 0.0

    def __post_init__(self) -> None:
        try:
            self.a_norm(0)
        except AggregationError as exc:
            raise ConfigError(f"run config optimizer/momentum/lr/proximal-mu: {exc}") from exc

    def a_norm(self, steps: int) -> float:
        """:math:`\\|a\\|_1` of ``steps`` local steps (:func:`local_solver_norm`)."""
        momentum = self.momentum if self.optimizer == "sgd" else 0.0
        return local_solver_norm(steps, momentum=momentum, lr=self.lr,
                                 proximal_mu=self.proximal_mu)
