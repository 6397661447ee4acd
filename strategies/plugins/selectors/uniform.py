"""Uniform client selection: m of the available sites without replacement, seeded.

With ``selection.m = 0`` the count is ``ceil(fraction-train x connected)``, as in
Flower's FedAvg; ``min-nodes`` is how many sites the round waits for, not how
many train.
"""

from __future__ import annotations

import math

import numpy as np

from strategies.plugins.registries import SELECTORS
from strategies.plugins.run_settings import RunSettings
from strategies.plugins.selectors.options import SelectionOptions
from strategies.selection import uniform_sample
from strategies.wire.plugin_options import Plugin


@SELECTORS.register("uniform")
class UniformSelector(Plugin):
    """Samples ``m`` sites per round; ``m = 0`` means ``ceil(fraction * N)``."""

    Options = SelectionOptions

    def __init__(self, m: int = 0, fraction: float = 1.0, seed: int = 0) -> None:
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        self.m, self.fraction = SelectionOptions(m=m).m, fraction
        self._rng = np.random.default_rng(seed)
        self.times_selected: dict[int, int] = {}
        self.last: dict = {}

    @classmethod
    def from_options(cls, options: SelectionOptions, settings: RunSettings) -> UniformSelector:
        """The selector for a run (``selection.m``; ``d``, ``subset``, ... are not used)."""
        return cls(m=options.m, fraction=settings.fraction_train, seed=settings.seed)

    def select(self, server_round: int, nodes: list[int], ctx=None) -> list[int]:
        """The node ids to train this round (sorted)."""
        count = self.m or math.ceil(self.fraction * len(nodes))
        chosen = sorted(int(n) for n in uniform_sample(nodes, min(count, len(nodes)),
                                                       self._rng))
        for node in chosen:
            self.times_selected[node] = self.times_selected.get(node, 0) + 1
        self.last = {"selected": chosen}
        return chosen
