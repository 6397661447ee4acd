"""Krum and Multi-Krum selection.

Blanchard et al., *Machine Learning with Adversaries: Byzantine Tolerant
Gradient Descent*, NeurIPS 2017, Sec. 4. With ``n`` updates of which at most
``f`` are Byzantine, the score of update ``k`` is the sum of squared distances
to its ``n - f - 2`` nearest neighbours:

    s(k) = sum_{l in N_k} ||Delta_k - Delta_l||^2                           (3)

Krum keeps the update of lowest score; Multi-Krum keeps the ``m`` lowest and
averages them (here with the caller's weights, so it composes with FedAvg and
FedNova). The paper requires ``2f + 2 < n``; with fewer sites the neighbour
count is clamped to at least 1, as Flower's MultiKrum does.
"""

from __future__ import annotations

import numpy as np

from strategies.robust.stack import as_stack
from strategies.wire.errors import ConfigError

__all__ = ["krum_scores", "lowest_scores", "multi_krum_select"]


def _squared_distances(stack: np.ndarray) -> np.ndarray:
    """Pairwise ``||x_k - x_l||^2`` in float64 (Gram form, clipped at 0)."""
    x = stack.astype(np.float64, copy=False)
    sq = np.einsum("ij,ij->i", x, x)
    dist = sq[:, None] + sq[None, :] - 2.0 * (x @ x.T)
    np.maximum(dist, 0.0, out=dist)
    np.fill_diagonal(dist, 0.0)
    return dist


def krum_scores(updates: np.ndarray, f: int) -> np.ndarray:
    """Eq. (3) for every row of ``updates`` (``(n, d)``), with ``f`` Byzantine sites assumed."""
    stack = as_stack(updates, "multi-krum")
    n = stack.shape[0]
    if not (isinstance(f, int) and 0 <= f < n):
        raise ConfigError(f"multi-krum: f must be an int in [0, n = {n}), got {f!r}")
    if n == 1:
        return np.zeros(1)
    neighbours = max(1, n - f - 2)
    dist = _squared_distances(stack)
    nearest = np.sort(dist, axis=1)[:, 1 : neighbours + 1]  # column 0 is the distance to itself
    return nearest.sum(axis=1)


def multi_krum_select(updates: np.ndarray, f: int, m: int) -> np.ndarray:
    """Indices of the ``m`` rows of lowest Krum score, in increasing score order (ties by index)."""
    return lowest_scores(krum_scores(updates, f), m)


def lowest_scores(scores: np.ndarray, m: int) -> np.ndarray:
    """Indices of the ``m`` lowest ``scores``, in increasing score order (ties by index)."""
    n = scores.size
    if not (isinstance(m, int) and 1 <= m <= n):
        raise ConfigError(f"multi-krum: m must be an int in [1, n = {n}], got {m!r}")
    return np.argsort(scores, kind="stable")[:m]
