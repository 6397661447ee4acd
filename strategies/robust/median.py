"""Coordinate-wise median.

Yin et al., *Byzantine-Robust Distributed Learning: Towards Optimal
Statistical Rates*, ICML 2018, Def. 1:

    med(Delta)_j = median{Delta_{k,j} : k = 1..n}                          (1)

It tolerates fewer than ``n / 2`` arbitrary updates per coordinate
(breakdown point 1/2). Unweighted, as in the paper.
"""

from __future__ import annotations

import numpy as np

from strategies.robust.stack import as_stack

__all__ = ["coordinate_median"]


def coordinate_median(updates: np.ndarray) -> np.ndarray:
    """Eq. (1) over the rows of ``updates`` (``(n, d)``); returns a ``(d,)`` vector."""
    stack = as_stack(updates, "median")
    return np.median(stack, axis=0).astype(stack.dtype)
