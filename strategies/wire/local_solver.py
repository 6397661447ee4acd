"""The sites' local solver as the server knows it, to compute FedNova's a-norm.

FedNova (Wang, Liu, Liang, Joshi, Poor, NeurIPS 2020, eq. (6)-(7)) normalises
each site's update by :math:`\\|a_i\\|_1`, the l1 norm of the coefficients of
the local solver over the :math:`\\tau_i` steps the site actually ran. All sites
run the solver of the run config, so the server computes :math:`\\|a_i\\|_1`
itself from the reported (validated) step count instead of trusting a value a
site sends: a site cannot inflate its weight with an a-norm of ``1e-300``.

Wang, Liu, Liang, Joshi, Poor, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020.

The coefficient model (:func:`local_solver_coefficients`) and its l1 norm
(:func:`local_solver_norm`) are functional core, also importable from
:mod:`strategies.aggregation` next to :func:`strategies.aggregation.fednova_delta`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

import numpy as np
from strategies.wire.errors import ConfigError

__all__ = ["LocalSolver", "LocalSolverError", "local_solver_coefficients", "local_solver_norm"]


class LocalSolverError(ConfigError):
    """Local solver settings (steps, momentum, lr, proximal mu) FedNova cannot model."""


def _check_solver(steps: int, momentum: float, lr: float, proximal_mu: float) -> None:
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)):
        raise LocalSolverError(f"steps must be an int, got {type(steps).__name__}")
    if steps < 0:
        raise LocalSolverError(f"steps must be >= 0, got {steps}")
    for name, value in (("momentum", momentum), ("lr", lr), ("proximal_mu", proximal_mu)):
        if isinstance(value, bool) or not isinstance(value, (Real, np.number)):
            raise LocalSolverError(f"{name} must be a real number, got {value!r}")
        if not math.isfinite(value) or value < 0.0:
            raise LocalSolverError(f"{name} must be finite and >= 0, got {value!r}")
    if momentum >= 1.0:
        raise LocalSolverError(f"momentum must be in [0, 1), got {momentum!r}")
    if proximal_mu > 0.0 and lr <= 0.0:
        raise LocalSolverError(
            "proximal_mu > 0 needs the local learning rate: pass lr > 0 "
            f"(got lr={lr!r}, proximal_mu={proximal_mu!r})"
        )
    if lr * proximal_mu > 1.0:
        raise LocalSolverError(
            f"lr * proximal_mu = {lr * proximal_mu!r} > 1: the proximal step "
            "overshoots the anchor, the solver coefficients alternate in sign "
            "and FedNova's normalisation is undefined"
        )


def local_solver_coefficients(
    steps: int, momentum: float = 0.0, lr: float = 0.0, proximal_mu: float = 0.0
) -> np.ndarray:
    r"""Return the local solver's coefficient vector :math:`a_i` (float64).

    Wang et al. (NeurIPS 2020, generalized update rule) write the cumulative local update of
    client :math:`i` after :math:`\tau` steps from :math:`x_0` as
    :math:`\Delta_i = x_0 - x_\tau = \eta \sum_{k=0}^{\tau-1} a_{i,k} g_k`, where
    :math:`g_k` is the stochastic gradient of the local loss at step :math:`k`.
    The local solver modelled here is PyTorch ``SGD`` (dampening 0, no
    Nesterov, no weight decay) with heavy-ball momentum :math:`\rho` (the first
    buffer is the gradient) and an optional FedProx term
    :math:`\tfrac{\mu}{2}\|x - x_0\|^2` added to the loss:

    .. math::

        b_k = \rho b_{k-1} + g_k + \mu (x_k - x_0), \quad b_{-1} = 0, \qquad
        x_{k+1} = x_k - \eta b_k .

    With :math:`Y_k = (x_0 - x_k)/\eta` the recursion is linear,
    :math:`Y_{k+1} = (1 - \eta\mu) Y_k + \rho b_{k-1} + g_k` and
    :math:`b_k = \rho b_{k-1} - \eta\mu Y_k + g_k`, so :math:`a_{k}` is the
    impulse response of the state matrix
    :math:`M = \begin{pmatrix} 1-\eta\mu & \rho \\ -\eta\mu & \rho \end{pmatrix}`:
    :math:`a_{\tau-1-m} = e_1^\top M^m (1, 1)^\top`. Special cases:

    * plain SGD: :math:`a_k = 1`;
    * momentum: :math:`a_k = (1 - \rho^{\tau-k}) / (1 - \rho)`;
    * proximal: :math:`a_k = (1 - \eta\mu)^{\tau-1-k}`.

    Parameters
    ----------
    steps : int
        Number of local steps :math:`\tau \ge 0` actually performed.
    momentum : float, default 0.0
        Heavy-ball momentum :math:`\rho \in [0, 1)`.
    lr : float, default 0.0
        Local learning rate :math:`\eta`; only needed when ``proximal_mu > 0``.
    proximal_mu : float, default 0.0
        FedProx coefficient :math:`\mu \ge 0`, with :math:`\eta\mu \le 1`.

    Returns
    -------
    numpy.ndarray
        :math:`(a_0, \dots, a_{\tau-1})`, shape ``(steps,)``.

    Raises
    ------
    LocalSolverError
        On invalid parameters, or if the combination of momentum and proximal
        term yields negative coefficients (then :math:`\|a\|_1 \ne \sum_k a_k`
        and the FedNova normalisation is not meaningful).
    """
    _check_solver(steps, momentum, lr, proximal_mu)
    rho, shrink = float(momentum), float(lr) * float(proximal_mu)
    a = np.empty(steps, dtype=np.float64)
    y, b = 1.0, 1.0  # M^0 (1, 1)^T
    for m in range(steps):
        a[steps - 1 - m] = y
        y, b = (1.0 - shrink) * y + rho * b, -shrink * y + rho * b
    if steps and a.min() < 0.0:
        raise LocalSolverError(
            f"local solver coefficients become negative (momentum={rho!r}, "
            f"lr*proximal_mu={shrink!r}); FedNova requires a nonnegative a-vector"
        )
    return a


def local_solver_norm(
    steps: int, momentum: float = 0.0, lr: float = 0.0, proximal_mu: float = 0.0
) -> float:
    r"""Return :math:`\|a_i\|_1` of the local solver (Wang et al. 2020, FedNova).

    Closed forms (see :func:`local_solver_coefficients` for the model):

    * plain SGD: :math:`\|a\|_1 = \tau`;
    * heavy-ball momentum :math:`\rho` (PyTorch style, first buffer = gradient):
      :math:`\|a\|_1 = \sum_{k=1}^{\tau} (1 - \rho^k)/(1 - \rho)`;
    * FedProx with learning rate :math:`\eta` and coefficient :math:`\mu`:
      :math:`\|a\|_1 = (1 - (1 - \eta\mu)^\tau) / (\eta\mu)`;
    * momentum *and* proximal term together: no simple closed form; the
      general coefficient vector is computed by the linear recursion of
      :func:`local_solver_coefficients` and summed (all entries must be
      nonnegative).

    For a constant gradient :math:`g` the cumulative update is exactly
    :math:`\Delta = \eta\, g\, \|a\|_1`.

    Parameters
    ----------
    steps : int
        Local steps :math:`\tau \ge 0` actually performed.
    momentum : float, default 0.0
        Heavy-ball momentum :math:`\rho \in [0, 1)`.
    lr : float, default 0.0
        Local learning rate :math:`\eta` (needed only with ``proximal_mu > 0``).
    proximal_mu : float, default 0.0
        FedProx coefficient :math:`\mu \ge 0`, with :math:`\eta\mu \le 1`.

    Returns
    -------
    float
        :math:`\|a_i\|_1` (0.0 when ``steps == 0``).

    Raises
    ------
    LocalSolverError
        On invalid parameters (``steps < 0``, ``momentum`` outside ``[0, 1)``,
        negative or non-finite ``lr``/``proximal_mu``, ``proximal_mu > 0`` with
        ``lr == 0``, ``lr * proximal_mu > 1``).
    """
    _check_solver(steps, momentum, lr, proximal_mu)
    rho, shrink = float(momentum), float(lr) * float(proximal_mu)
    if shrink > 0.0 and rho > 0.0:
        return float(local_solver_coefficients(steps, rho, lr, proximal_mu).sum())
    if shrink > 0.0:
        return (1.0 - (1.0 - shrink) ** steps) / shrink
    if rho > 0.0:
        # sum_{k=1..tau} (1 - rho^k) / (1 - rho)
        #   = (tau - rho (1 - rho^tau) / (1 - rho)) / (1 - rho)
        return (steps - rho * (1.0 - rho**steps) / (1.0 - rho)) / (1.0 - rho)
    return float(steps)


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
        except LocalSolverError as exc:
            raise ConfigError(f"run config optimizer/momentum/lr/proximal-mu: {exc}") from exc

    def a_norm(self, steps: int) -> float:
        """:math:`\\|a\\|_1` of ``steps`` local steps (:func:`local_solver_norm`; momentum for ``sgd`` only)."""
        momentum = self.momentum if self.optimizer == "sgd" else 0.0
        return local_solver_norm(steps, momentum=momentum, lr=self.lr,
                                 proximal_mu=self.proximal_mu)
