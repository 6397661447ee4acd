"""The adaptive server optimizers' shared moments (FedAdagrad, FedAdam, FedYogi).

Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar, McMahan, "Adaptive Federated
Optimization", ICLR 2021, Algorithm 2. Their descent direction is ``Delta_t = -Delta``
(our ``Delta`` is ``x - mean of the sites' models``); per coordinate:

    m_t = beta1 m_{t-1} + (1 - beta1) Delta_t                    (first moment)
    v_t = ... Delta_t^2 ...                                        (eqs. (2)-(4): the subclass)
    x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)

so the step subtracted from ``x`` is ``s = -eta m_t / (sqrt(v_t) + tau)``. ``m`` and ``v``
are kept in float64, in the paper's sign. Where ours differs from Flower's Message-API
``FedOpt`` strategies (``flwr.serverapp.strategy``):

* ``m_{-1} = v_{-1} = 0``, as Flower (the paper asks ``v_{-1} >= tau^2`` for its analysis;
  ``tau`` outside the square root keeps the step finite either way);
* no bias correction: Flower's ``FedAdam`` multiplies eta by
  ``sqrt(1 - beta2^(t+1)) / (1 - beta1^(t+1))``; Algorithm 2 has none, and neither has ours;
* FedAdagrad reads ``server-opt.beta1`` (Algorithm 2 keeps the first moment for all three;
  Flower's ``FedAdagrad`` fixes beta1 = 0: set ``server-opt.beta1 = 0`` for it);
* the defaults are Flower's: tau 1e-3, beta1 0.9, beta2 0.99, eta 0.1 (0.01 for FedYogi).
"""

from __future__ import annotations

from abc import abstractmethod

import numpy as np

from strategies.plugins.server_opt.base import ServerOptPlugin

__all__ = ["AdaptiveOptimizer"]


class AdaptiveOptimizer(ServerOptPlugin):
    """Algorithm 2's first moment and step; the subclass gives ``v_t`` (:meth:`second_moment`)."""

    default_eta = 0.1
    beta1: float
    tau: float

    def __init__(self, eta: float = 0.0, **options: float) -> None:
        super().__init__(eta, **options)
        #: m_t and v_t of each trained array (float64, the paper's sign), None before round 1.
        self.m: list[np.ndarray] | None = None
        self.v: list[np.ndarray] | None = None

    @abstractmethod
    def second_moment(self, v: np.ndarray, squared: np.ndarray) -> np.ndarray:
        """``v_t`` from ``v_{t-1}`` and ``Delta_t^2``."""

    def _step(self, delta: list[np.ndarray]) -> list[np.ndarray]:
        """``m_t``, ``v_t`` from ``Delta_t = -Delta``; ``-eta m_t / (sqrt(v_t) + tau)``."""
        if self.m is None or self.v is None:
            self.m = [np.zeros_like(d) for d in delta]
            self.v = [np.zeros_like(d) for d in delta]
        direction = [-d for d in delta]
        self.m = [self.beta1 * m + (1.0 - self.beta1) * g for m, g in zip(self.m, direction)]
        self.v = [self.second_moment(v, g * g) for v, g in zip(self.v, direction)]
        return [-self.eta * m / (np.sqrt(v) + self.tau) for m, v in zip(self.m, self.v)]
