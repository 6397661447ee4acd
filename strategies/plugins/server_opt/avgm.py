"""FedAvgM: server momentum (``strategy.server-opt = "avgm"``).

Hsu, Qi, Brown, "Measuring the Effects of Non-Identical Data Distribution for Federated
Visual Classification", 2019, Algorithm 1 (server momentum): with the pseudo-gradient
``Delta`` (our aggregate, ``x - mean of the sites' models``),

    v <- beta v + Delta,        x <- x - eta v

``v`` starts at 0, so round 1's step is ``eta Delta`` (Flower's ``FedAvgM`` starts its
momentum vector at round 1's ``Delta``: the same). ``beta`` is ``server-opt.momentum``,
default 0.9 (the value Hsu et al. use); Flower's default 0 would make ``avgm`` plain FedAvg.
``eta`` defaults to 1, as Flower's ``server_learning_rate``. With FedNova's ``Delta`` and
``eta = 1`` it is FedNova's server momentum (Wang et al. 2020, Sec. 5), the former
``fednova.server-momentum`` (retired, #45).
"""

from __future__ import annotations

import numpy as np

from strategies.plugins.registries import SERVER_OPTIMIZERS
from strategies.plugins.server_opt.base import ServerOptPlugin


@SERVER_OPTIMIZERS.register("avgm")
class ServerMomentum(ServerOptPlugin):
    """Heavy-ball momentum on the server: ``v <- beta v + Delta``, ``s = eta v``."""

    name = "avgm"
    reads = ("eta", "momentum")
    default_eta = 1.0
    momentum: float

    def __init__(self, eta: float = 0.0, **options: float) -> None:
        super().__init__(eta, **options)
        #: The velocity of each trained array (float64), None before round 1.
        self.velocity: list[np.ndarray] | None = None

    def _step(self, delta: list[np.ndarray]) -> list[np.ndarray]:
        """``v <- beta v + Delta``; ``eta v``."""
        if self.velocity is None:
            self.velocity = [np.zeros_like(d) for d in delta]
        self.velocity = [self.momentum * v + d for v, d in zip(self.velocity, delta)]
        return [self.eta * v for v in self.velocity]
