"""Reading benchmark curves: smoothing, first crossing of a target, a step-function resample.

A federated run yields one number per round (accuracy, loss) or per event
time. These helpers answer the questions the benchmarks ask of such curves:
"when did it first get there?" and "what model was available at time t?".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["trailing_mean", "rounds_to_target", "loss_on_grid", "time_to_reach"]


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


def loss_on_grid(times: np.ndarray, losses: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Loss of the latest model available at each grid time (step function)."""
    idx = np.searchsorted(times, grid, side="right") - 1
    return losses[np.clip(idx, 0, len(losses) - 1)]


def time_to_reach(grid: np.ndarray, curve: np.ndarray, target: float) -> float:
    """First grid time at which ``curve <= target`` (``inf`` if never)."""
    hit = np.nonzero(curve <= target)[0]
    return float(grid[hit[0]]) if hit.size else float("inf")
