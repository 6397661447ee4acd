"""FedYogi (``strategy.server-opt = "yogi"``): Reddi et al., ICLR 2021, Algorithm 2, eq. (4):
``v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)``: ``v`` moves towards
``Delta_t^2`` by an additive step, never overshooting it as Adam's average may (Zaheer et al.,
NeurIPS 2018). The rest: :mod:`strategies.plugins.server_opt.adaptive`."""

from __future__ import annotations

import numpy as np

from strategies.plugins.registries import SERVER_OPTIMIZERS
from strategies.plugins.server_opt.adaptive import AdaptiveOptimizer


@SERVER_OPTIMIZERS.register("yogi")
class FedYogi(AdaptiveOptimizer):
    """Yogi's additive second moment; eta 0.01 (Flower's ``FedYogi``)."""

    name = "yogi"
    reads = ("eta", "beta1", "beta2", "tau")
    default_eta = 0.01
    beta2: float

    def second_moment(self, v: np.ndarray, squared: np.ndarray) -> np.ndarray:
        """``v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)``."""
        return v - (1.0 - self.beta2) * squared * np.sign(v - squared)
