"""FedAdagrad (``strategy.server-opt = "adagrad"``): Reddi et al., ICLR 2021, Algorithm 2,
eq. (2): ``v_t = v_{t-1} + Delta_t^2`` (the rest: :mod:`strategies.plugins.server_opt.adaptive`)."""

from __future__ import annotations

import numpy as np

from strategies.plugins.registries import SERVER_OPTIMIZERS
from strategies.plugins.server_opt.adaptive import AdaptiveOptimizer


@SERVER_OPTIMIZERS.register("adagrad")
class FedAdagrad(AdaptiveOptimizer):
    """The sum of the squared pseudo-gradients; eta 0.1 (Flower's)."""

    name = "adagrad"
    reads = ("eta", "beta1", "tau")

    def second_moment(self, v: np.ndarray, squared: np.ndarray) -> np.ndarray:
        """``v_{t-1} + Delta_t^2``."""
        return v + squared
