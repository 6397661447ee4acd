"""Per-update L2 norm bound ("norm clipping").

Sun et al., *Can You Really Backdoor Federated Learning?*, NeurIPS FL workshop
2019, Sec. 3: the server scales each update ``Delta_k`` to

    Delta_k * min(1, M / ||Delta_k||_2)                                   (1)

so no single site moves the model further than ``M``. ``M`` is either an
absolute bound or ``kappa`` times the median of the round's update norms (an
adaptive bound that follows the natural shrinking of updates during training,
as in Andrew et al., *Differentially Private Learning with Adaptive Clipping*,
NeurIPS 2021, but without noise). When both are given the smaller one holds.

On a model update (a list of arrays, :func:`update_norm`, :func:`scaled`) only
the **floating-point** arrays are measured and scaled: an integer buffer (such as
BatchNorm's ``num_batches_tracked``, whose update is minus the local step count)
carries no learnt signal and would dominate the norm.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from strategies.errors import ConfigError
from strategies.robust.stack import as_stack

__all__ = ["NormBound", "clip_factors", "clip_to_bound", "round_bound", "scaled",
           "update_norm"]


@dataclass(frozen=True)
class NormBound:
    """The bound ``M`` of eq. (1): ``absolute`` (> 0) and/or ``kappa`` x median (kappa >= 1)."""

    absolute: float | None = None
    kappa: float | None = None

    def __post_init__(self) -> None:
        if self.absolute is None and self.kappa is None:
            raise ConfigError("norm bound: give 'absolute' (> 0), 'kappa' (>= 1), or both")
        if self.absolute is not None and not (math.isfinite(self.absolute) and self.absolute > 0):
            raise ConfigError(f"norm bound: 'absolute' must be a finite number > 0, got {self.absolute!r}")
        if self.kappa is not None and not (math.isfinite(self.kappa) and self.kappa >= 1):
            raise ConfigError(f"norm bound: 'kappa' must be a finite number >= 1, got {self.kappa!r}")


def round_bound(norms: np.ndarray, bound: NormBound) -> float:
    """The round's ``M``: the smaller of the absolute bound and ``kappa * median(norms)``."""
    norms = np.asarray(norms, dtype=np.float64)
    if norms.ndim != 1 or norms.size == 0:
        raise ConfigError(f"norm bound: norms must be a non-empty vector, got shape {norms.shape}")
    candidates = []
    if bound.absolute is not None:
        candidates.append(float(bound.absolute))
    if bound.kappa is not None:
        candidates.append(float(bound.kappa) * float(np.median(norms)))
    return min(candidates)


def clip_to_bound(updates: np.ndarray, bound: NormBound) -> tuple[np.ndarray, np.ndarray, float]:
    """Apply eq. (1) to each row of ``updates``.

    Returns
    -------
    clipped : ndarray
        The ``(n, d)`` updates, each row scaled by its factor (same dtype).
    factors : ndarray
        ``min(1, M / ||Delta_k||)`` per row (1.0 for a zero row), for the record.
    bound_used : float
        The round's ``M``.
    """
    stack = as_stack(updates, "norm bound")
    factors, m = clip_factors(np.linalg.norm(stack.astype(np.float64, copy=False), axis=1), bound)
    clipped = stack * factors.astype(stack.dtype)[:, None]
    return clipped, factors, m


def clip_factors(norms: np.ndarray, bound: NormBound) -> tuple[np.ndarray, float]:
    """The factors ``min(1, M / ||Delta_k||)`` of eq. (1) from the update norms alone.

    Returns
    -------
    factors : ndarray
        One factor per norm (1.0 for a norm at or below ``M``, so for a zero update).
    bound_used : float
        The round's ``M`` (:func:`round_bound`).
    """
    norms = np.asarray(norms, dtype=np.float64)
    m = round_bound(norms, bound)
    factors = np.ones_like(norms)
    over = norms > m
    factors[over] = m / norms[over]
    return factors, m


def update_norm(update: Sequence[np.ndarray]) -> float:
    """``||Delta_k||_2`` over the floating-point arrays of one update (float64)."""
    total = 0.0
    for array in update:
        if np.issubdtype(array.dtype, np.floating):
            flat = array.ravel().astype(np.float64, copy=False)
            total += float(flat @ flat)
    return float(np.sqrt(total))


def scaled(update: Sequence[np.ndarray], factor: float) -> list[np.ndarray]:
    """``factor * Delta_k`` on the floating-point arrays; integer arrays are kept as they are."""
    return [(array * array.dtype.type(factor)) if np.issubdtype(array.dtype, np.floating)
            else array for array in update]
