"""Per-update L2 norm bound ("norm clipping").

Sun et al., *Can You Really Backdoor Federated Learning?*, NeurIPS FL workshop
2019, Sec. 3: the server scales each update ``Delta_k`` to

    Delta_k * min(1, M / ||Delta_k||_2)                                   (1)

so no single site moves the model further than ``M``. ``M`` is the smallest of

* an absolute bound;
* ``kappa`` times the **lower** median of the round's update norms (an adaptive
  bound that follows the natural shrinking of updates during training, as in
  Andrew et al., *Differentially Private Learning with Adaptive Clipping*,
  NeurIPS 2021, but without noise). For an even count the lower of the two
  middle norms is taken (:func:`lower_median`): with two sites it is the smaller
  norm, so one site of two can never raise the bound (the plain median of two
  norms is half the larger one, and ``kappa >= 2`` left a x1000 update unclipped);
* ``history_kappa`` times a **reference** from earlier rounds: the median of the
  norms accepted (after clipping) in the last rounds (:func:`history_reference`).
  A site alone in a round, or a majority of one, cannot move it.

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

from strategies.robust.stack import as_stack
from strategies.wire.errors import ConfigError

__all__ = ["NormBound", "clip_factors", "clip_to_bound", "history_reference", "lower_median",
           "round_bound", "scaled", "update_norm"]


@dataclass(frozen=True)
class NormBound:
    """The bound ``M`` of eq. (1): ``absolute`` (> 0) and/or ``kappa`` x lower median
    (kappa >= 1), and ``history_kappa`` (>= 1) x an earlier rounds' reference when one is known."""

    absolute: float | None = None
    kappa: float | None = None
    history_kappa: float | None = None

    def __post_init__(self) -> None:
        if self.absolute is None and self.kappa is None:
            raise ConfigError("norm bound: give 'absolute' (> 0), 'kappa' (>= 1), or both")
        if self.absolute is not None and not (math.isfinite(self.absolute) and self.absolute > 0):
            raise ConfigError(f"norm bound: 'absolute' must be a finite number > 0, got {self.absolute!r}")
        if self.kappa is not None and not (math.isfinite(self.kappa) and self.kappa >= 1):
            raise ConfigError(f"norm bound: 'kappa' must be a finite number >= 1, got {self.kappa!r}")
        if self.history_kappa is not None and not (math.isfinite(self.history_kappa)
                                                   and self.history_kappa >= 1):
            raise ConfigError("norm bound: 'history_kappa' must be a finite number >= 1, got "
                              f"{self.history_kappa!r}")


def lower_median(values: np.ndarray) -> float:
    """The median of ``values`` for an odd count, the lower middle value for an even one."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    return float(ordered[(ordered.size - 1) // 2])


def history_reference(history: Sequence[Sequence[float]]) -> float | None:
    """The median of the norms accepted in the rounds of ``history``; None when there are none."""
    pooled = [norm for round_norms in history for norm in round_norms]
    return float(np.median(pooled)) if pooled else None


def round_bound(norms: np.ndarray, bound: NormBound, reference: float | None = None) -> float:
    """The round's ``M``: the smallest of the absolute bound, ``kappa * lower_median(norms)``
    and, with a ``reference`` (:func:`history_reference`), ``history_kappa * reference``."""
    norms = np.asarray(norms, dtype=np.float64)
    if norms.ndim != 1 or norms.size == 0:
        raise ConfigError(f"norm bound: norms must be a non-empty vector, got shape {norms.shape}")
    candidates: list[float] = []
    if bound.absolute is not None:
        candidates.append(float(bound.absolute))
    if bound.kappa is not None:
        candidates.append(float(bound.kappa) * lower_median(norms))
    if bound.history_kappa is not None and reference is not None:
        candidates.append(float(bound.history_kappa) * reference)
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


def clip_factors(norms: np.ndarray, bound: NormBound,
                 reference: float | None = None) -> tuple[np.ndarray, float]:
    """The factors ``min(1, M / ||Delta_k||)`` of eq. (1) from the update norms alone
    (and the earlier rounds' ``reference``, :func:`round_bound`).

    Returns
    -------
    factors : ndarray
        One factor per norm (1.0 for a norm at or below ``M``, so for a zero update).
    bound_used : float
        The round's ``M`` (:func:`round_bound`).
    """
    norms = np.asarray(norms, dtype=np.float64)
    m = round_bound(norms, bound, reference)
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
