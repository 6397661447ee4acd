"""FedAdam (``strategy.server-opt = "adam"``): Reddi et al., ICLR 2021, Algorithm 2, eq. (3):
``v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2`` (the rest:
:mod:`strategies.plugins.server_opt.adaptive`; no bias correction, unlike Flower's)."""

from __future__ import annotations

import numpy as np

from strategies.plugins.registries import SERVER_OPTIMIZERS
from strategies.plugins.server_opt.adaptive import AdaptiveOptimizer


@SERVER_OPTIMIZERS.register("adam")
class FedAdam(AdaptiveOptimizer):
    """An exponential average of the squared pseudo-gradients; eta 0.1 (Flower's)."""

    name = "adam"
    reads = ("eta", "beta1", "beta2", "tau")
    beta2: float

    def second_moment(self, v: np.ndarray, squared: np.ndarray) -> np.ndarray:
        """``beta2 v_{t-1} + (1 - beta2) Delta_t^2``."""
        return self.beta2 * v + (1.0 - self.beta2) * squared
