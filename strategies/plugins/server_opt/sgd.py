"""Plain server SGD (``strategy.server-opt = "sgd"``, the default): ``x <- x - eta Delta``.

With ``eta = 1`` (the default) the step is the aggregator's ``Delta`` itself, the very
arrays: the new model is ``x - Delta`` bit for bit as without a server optimizer (FedAvg,
McMahan et al. 2017); it is then not ``active``, and the train stage takes that step
itself without entering it (its round count stays 0). Another ``eta`` is Reddi et al.'s FedAvg with a server learning rate
(ICLR 2021, Algorithm 2 with ``x_{t+1} = x_t + eta Delta_t``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from strategies.plugins.registries import SERVER_OPTIMIZERS
from strategies.plugins.server_opt.base import ServerOptPlugin


@SERVER_OPTIMIZERS.register("sgd")
class ServerSGD(ServerOptPlugin):
    """``s = eta Delta`` on the trained arrays; no state but the round count."""

    name = "sgd"
    reads = ("eta",)
    default_eta = 1.0

    @property
    def active(self) -> bool:
        """False at ``eta = 1``: the step is ``Delta`` itself."""
        return self.eta != 1.0

    def step(self, delta: list[np.ndarray], trained: Sequence[bool]) -> list[np.ndarray]:
        """``Delta`` itself when ``eta = 1``; else ``eta Delta`` on the trained arrays."""
        if self.eta == 1.0:
            self.rounds += 1
            return list(delta)
        return super().step(delta, trained)

    def _step(self, delta: list[np.ndarray]) -> list[np.ndarray]:
        """``eta Delta``."""
        return [self.eta * d for d in delta]
