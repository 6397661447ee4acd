"""Coordinate-wise trimmed mean.

Yin et al., *Byzantine-Robust Distributed Learning: Towards Optimal
Statistical Rates*, ICML 2018, Def. 2: for each coordinate ``j`` drop the
``b = floor(beta * n)`` largest and ``b`` smallest values among the ``n``
updates and average the remaining ``n - 2b``:

    trmean_beta(Delta)_j = 1 / (n - 2b) * sum_{k in U_j} Delta_{k,j}        (2)

It tolerates up to ``b`` arbitrary updates per coordinate. The mean of the kept
values is unweighted, as in the paper: a site's self-reported example count
must not decide which values are trimmed.
"""

from __future__ import annotations

import math

import numpy as np

from strategies.robust.stack import as_stack
from strategies.wire.errors import ConfigError

__all__ = ["trimmed_count", "trimmed_mean"]


def trimmed_count(n: int, beta: float) -> int:
    """``b = floor(beta * n)``, the values cut at each end; ``beta`` in ``[0, 0.5)``."""
    if not (math.isfinite(beta) and 0.0 <= beta < 0.5):
        raise ConfigError(f"trimmed mean: beta must be in [0, 0.5), got {beta!r}")
    return int(math.floor(beta * n))


def trimmed_mean(updates: np.ndarray, beta: float) -> np.ndarray:
    """Eq. (2) over the rows of ``updates`` (``(n, d)``); returns a ``(d,)`` vector."""
    stack = as_stack(updates, "trimmed mean")
    n = stack.shape[0]
    b = trimmed_count(n, beta)
    if b == 0:
        return stack.mean(axis=0, dtype=np.float64).astype(stack.dtype)
    kept = np.sort(stack, axis=0)[b : n - b]
    return kept.mean(axis=0, dtype=np.float64).astype(stack.dtype)
