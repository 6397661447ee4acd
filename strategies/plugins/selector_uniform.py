"""Uniform client selection: m of the available sites without replacement, seeded."""

from __future__ import annotations

import math

import numpy as np

from strategies.registry import SELECTORS
from strategies.selection import uniform_sample


@SELECTORS.register("uniform")
class UniformSelector:
    """Samples ``max(min_nodes, ceil(fraction * available))`` sites per round."""

    def __init__(self, fraction: float = 1.0, min_nodes: int = 1, seed: int = 0) -> None:
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        self.fraction, self.min_nodes = fraction, min_nodes
        self._rng = np.random.default_rng(seed)

    def select(self, server_round: int, nodes: list[int]) -> list[int]:
        """The node ids to train this round (sorted)."""
        count = min(len(nodes), max(self.min_nodes, math.ceil(self.fraction * len(nodes))))
        return sorted(int(n) for n in uniform_sample(nodes, count, self._rng))
