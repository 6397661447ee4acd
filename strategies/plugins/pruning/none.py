"""No pruning: the model stays dense, every coordinate is sent and trained."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from strategies.plugins.registries import PRUNINGS
from strategies.wire.plugin_options import Plugin


@PRUNINGS.register("none")
class NoPruning(Plugin):
    """The dense model (no options): no mask, nothing to report or track."""

    #: Prunes nothing: the rounds send and train the full model.
    active = False
    mode = ""
    report_codec = ""

    def __init__(self) -> None:
        self.version = 0
        self.masks: dict[str, np.ndarray] = {}

    def initialise(self, named: Mapping[str, np.ndarray],
                   structure: Mapping[str, Any]) -> dict[str, float]:
        """Nothing to prune."""
        return {}

    def report_due(self, server_round: int) -> bool:
        """Never: no squared gradients are asked."""
        return False

    def observe(self, server_round: int, named: Mapping[str, np.ndarray],
                sqgrad: Mapping[str, np.ndarray] | None, seconds: float) -> dict[str, float]:
        """Nothing to learn."""
        return {}
