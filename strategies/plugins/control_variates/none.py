"""No control variates: the sites' local steps are not corrected (the default)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from strategies.plugins.registries import CONTROL_VARIATES
from strategies.wire.plugin_options import Plugin


@CONTROL_VARIATES.register("none")
class NoControlVariates(Plugin):
    """Plain local steps (no options): nothing is sent down or back besides the model."""

    #: False: the rounds send no control variate and read none back.
    active = False

    def __init__(self) -> None:
        self.residual = np.zeros(0, np.float32)

    def control(self, size: int, sites: int) -> np.ndarray:
        """No control variate: an empty vector."""
        return np.zeros(0, np.float32)

    def observe(self, deltas: list[np.ndarray], sites: int) -> dict[str, float]:
        """Nothing to learn."""
        return {}

    def decline(self, refused: Iterable[str], trained: Iterable[str]) -> None:
        """No federation size to keep."""
