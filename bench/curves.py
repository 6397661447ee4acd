"""Reading benchmark curves: a trailing mean and the first round it reaches a target.

A federated run yields one number per round (accuracy, loss); "when did it first
get there?" is asked of its trailing mean.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["trailing_mean", "rounds_to_target"]


def trailing_mean(curve: Sequence[float] | np.ndarray, window: int) -> np.ndarray:
    """Mean of ``curve[max(0, i - window + 1) : i + 1]`` for every ``i`` (shorter at the start)."""
    curve = np.asarray(curve, dtype=float)
    csum = np.concatenate(([0.0], np.cumsum(curve)))
    idx = np.arange(len(curve))
    start = np.maximum(0, idx - window + 1)
    return (csum[idx + 1] - csum[start]) / (idx + 1 - start)


def rounds_to_target(curve: Sequence[float], target: float, window: int) -> int | None:
    """First round (1-based) whose trailing mean over ``window`` rounds is >= ``target``; None if never."""
    hits = np.flatnonzero(trailing_mean(curve, window) >= target)
    return int(hits[0]) + 1 if len(hits) else None
