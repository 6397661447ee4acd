r"""Robust statistics over the sites' values: a stack of updates, or one metric per site.

Each rule takes what the round's sites sent, one row per site, and returns plain numpy
values (or a float), unweighted: a site's self-reported example count buys no weight.
The same math serves the plug-ins (``strategies/plugins/defences/``: norm bound,
Multi-Krum; ``strategies/plugins/aggregators/``: trimmed mean, median), the best round's
score (``app.tracking.best_round``), the tests and the benchmarks (``bench/robustness.py``).

The stack
---------
The rules on an ``(n, d)`` stack (:func:`as_stack`: two-dimensional, at least one row,
floating point, finite; replies are checked finite before aggregation, so a bad stack is
a caller bug). On a model update ``Delta_k`` (a list of arrays in the model's parameter
order) the norm bound and Multi-Krum measure only the **floating-point** arrays
(:func:`float_stack`, :func:`update_norm`, :func:`scaled`): an integer buffer (such as
BatchNorm's ``num_batches_tracked``, whose update is minus the local step count) carries
no learnt signal and would dominate an L2 norm or a distance. The coordinate-wise rules
are applied to every array (:func:`coordinatewise`), integers included (rounded back
half-to-even, as the weighted mean does).

Coordinate-wise median and trimmed mean
---------------------------------------
Yin et al., *Byzantine-Robust Distributed Learning: Towards Optimal Statistical Rates*,
ICML 2018, Def. 1 and Def. 2:

    med(Delta)_j = median{Delta_{k,j} : k = 1..n}                           (1)

    trmean_beta(Delta)_j = 1 / (n - 2b) * sum_{k in U_j} Delta_{k,j}         (2)

The median (:func:`coordinate_median`) tolerates fewer than ``n / 2`` arbitrary updates
per coordinate (breakdown point 1/2). The trimmed mean (:func:`trimmed_mean`) drops, for
each coordinate ``j``, the ``b = floor(beta * n)`` largest and ``b`` smallest values
(:func:`trimmed_count`) and averages the remaining ``n - 2b`` (the set ``U_j``); it
tolerates up to ``b`` arbitrary updates per coordinate.

Krum and Multi-Krum
-------------------
Blanchard et al., *Machine Learning with Adversaries: Byzantine Tolerant Gradient
Descent*, NeurIPS 2017, Sec. 4. With ``n`` updates of which at most ``f`` are Byzantine,
the score of update ``k`` is the sum of squared distances to its ``n - f - 2`` nearest
neighbours ``N_k`` (:func:`krum_scores`):

    s(k) = sum_{l in N_k} ||Delta_k - Delta_l||^2                            (3)

Krum keeps the update of lowest score; Multi-Krum keeps the ``m`` lowest
(:func:`multi_krum_select`) and averages them (the plug-in, with the caller's weights,
so it composes with FedAvg and FedNova). The paper requires ``2f + 2 < n``; with fewer
sites the neighbour count is clamped to at least 1, as Flower's MultiKrum does.

Per-update L2 norm bound ("norm clipping")
------------------------------------------
Sun et al., *Can You Really Backdoor Federated Learning?*, NeurIPS FL workshop 2019,
Sec. 3: the server scales each update ``Delta_k`` to

    Delta_k * min(1, M / ||Delta_k||_2)                                      (4)

so no single site moves the model further than ``M`` (:func:`clip_to_bound`,
:func:`clip_factors`). ``M`` (:func:`round_bound`, :class:`NormBound`) is the smallest of

* an absolute bound;
* ``kappa`` times the **lower** median of the round's update norms (an adaptive bound
  that follows the natural shrinking of updates during training, as in Andrew et al.,
  *Differentially Private Learning with Adaptive Clipping*, NeurIPS 2021, but without
  noise). For an even count the lower of the two middle norms is taken
  (:func:`lower_median`): with two sites it is the smaller norm, so one site of two can
  never raise the bound (the plain median of two norms is half the larger one, and
  ``kappa >= 2`` left a x1000 update unclipped);
* ``history_kappa`` times a **reference** from earlier rounds: the median of the norms
  accepted (after clipping) in the last rounds (:func:`history_reference`). A site alone
  in a round, or a majority of one, cannot move it.

One metric per site: the best round's score
-------------------------------------------
Best-round selection (``app.tracking.best_round``) scores each round on its validation
metric. The example-weighted mean
(:func:`strategies.rounds.round_metrics.example_weighted_metrics`) lets one site decide
the score: ``val-auc`` reported as 0.70, 0.72 and 0.99 by three sites moves the mean by
the outlier's full weight. The score rules (:data:`ROBUST_RULES`, run config
``best-round.aggregate``; :data:`SCORE_RULES` its choices) take the sites' values of one
metric:

* :func:`site_median`, eq. (1) on a scalar: with ``n >= 3`` sites one site's value cannot
  move the score outside the range of the honest values;
* :func:`site_trimmed_mean`, eq. (2) on a scalar,

  .. math:: \operatorname{trmean}(v) = \frac{1}{n - 2b} \sum_{k=b+1}^{n-b} v_{(k)} ,

  :math:`v_{(k)}` sorted, with :math:`b = \max(1, \lfloor 0.2\,n \rfloor)` values cut at
  each end when :math:`n \ge 3` (so that one site is always cut, :data:`TRIM_FRACTION`),
  none below.

With two sites every score rule is the mean of the two values: no rule can tell the
honest site from the other. With three the median and the trimmed mean are one site's
value; the default rule, the paired site vote (:mod:`strategies.site_vote`), compares
two rounds on every site that scored both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from strategies.wire.errors import ConfigError
from strategies.wire.registry import Registry

__all__ = [
    "NormBound",
    "ROBUST_RULES",
    "SCORE_RULES",
    "TRIM_FRACTION",
    "as_stack",
    "clip_factors",
    "clip_to_bound",
    "coordinate_median",
    "coordinatewise",
    "float_stack",
    "history_reference",
    "krum_scores",
    "lowest_scores",
    "lower_median",
    "multi_krum_select",
    "round_bound",
    "scaled",
    "site_median",
    "site_trimmed_mean",
    "trimmed_count",
    "trimmed_mean",
    "update_norm",
]

#: One site's model update ``Delta_k``: its arrays in the model's parameter order.
Update = Sequence[np.ndarray]


# --- the stack ---------------------------------------------------------------------------

def as_stack(updates: np.ndarray, rule: str) -> np.ndarray:
    """``updates`` as a finite float array of shape ``(n >= 1, d)``.

    Raises
    ------
    ConfigError
        The stack is not two-dimensional, has no row, or holds NaN/inf
        (replies are checked finite before aggregation, so this is a caller bug).
    """
    stack = np.asarray(updates)
    if stack.ndim != 2 or stack.shape[0] == 0:
        raise ConfigError(f"{rule}: updates must be an (n >= 1, d) array, got shape {stack.shape}")
    if not np.issubdtype(stack.dtype, np.floating):
        raise ConfigError(f"{rule}: updates must be floating point, got {stack.dtype}")
    if not np.isfinite(stack).all():
        raise ConfigError(f"{rule}: updates must be finite (check replies before aggregating)")
    return stack


def _is_float(array: np.ndarray) -> bool:
    return np.issubdtype(array.dtype, np.floating)


def float_stack(updates: Sequence[Update]) -> np.ndarray:
    """The ``(n, d)`` float64 stack of the updates' floating-point arrays, one row per update.

    Raises
    ------
    ConfigError
        If the updates differ in their float arrays' count or sizes (replies are
        checked against the global model first, so this is a caller bug).
    """
    rows = [np.concatenate([a.ravel() for a in u if _is_float(a)] or [np.zeros(0)],
                           dtype=np.float64) for u in updates]
    if len({row.size for row in rows}) > 1:
        raise ConfigError(f"robust rules: updates of different sizes {[r.size for r in rows]}")
    return np.stack(rows) if rows else np.zeros((0, 0))


def coordinatewise(updates: Sequence[Update],
                   rule: Callable[[np.ndarray], np.ndarray]) -> list[np.ndarray]:
    """Apply a coordinate-wise ``rule`` (``(n, d)`` -> ``(d,)``) to every array position.

    Each position ``j`` is stacked over the updates in float64, reduced by
    ``rule`` and cast back to the array's dtype (integers rounded half-to-even
    and clipped to their range).

    Raises
    ------
    ConfigError
        For no update, or updates whose arrays differ in count or shape.
    """
    if not updates:
        raise ConfigError("robust rules: no update to aggregate")
    first = updates[0]
    if any(len(u) != len(first) for u in updates):
        raise ConfigError("robust rules: updates hold different numbers of arrays")
    result: list[np.ndarray] = []
    for j, ref in enumerate(first):
        if any(u[j].shape != ref.shape for u in updates):
            raise ConfigError(f"robust rules: array {j} differs in shape between updates")
        stack = np.stack([u[j].ravel() for u in updates]).astype(np.float64)
        value = rule(stack).reshape(ref.shape)
        if _is_float(ref):
            result.append(value.astype(ref.dtype))
        else:
            info = np.iinfo(ref.dtype)
            result.append(np.clip(np.rint(value), info.min, info.max).astype(ref.dtype))
    return result


# --- coordinate-wise median and trimmed mean: eqs. (1), (2) ------------------------------

def coordinate_median(updates: np.ndarray) -> np.ndarray:
    """Eq. (1) over the rows of ``updates`` (``(n, d)``); returns a ``(d,)`` vector."""
    stack = as_stack(updates, "median")
    return np.median(stack, axis=0).astype(stack.dtype)


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


# --- Krum and Multi-Krum: eq. (3) --------------------------------------------------------

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


# --- the norm bound: eq. (4) -------------------------------------------------------------

@dataclass(frozen=True)
class NormBound:
    """The bound ``M`` of eq. (4): ``absolute`` (> 0) and/or ``kappa`` x lower median
    (kappa >= 1), and ``history_kappa`` (>= 1) x an earlier rounds' reference when one is known.

    The default defence checkpoints it; ``former_types`` is its path before the robust
    rules were one module (:mod:`strategies.rounds.checkpoint`)."""

    former_types = ("strategies.robust.norm_bound.NormBound",)

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
    """Apply eq. (4) to each row of ``updates``.

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
    """The factors ``min(1, M / ||Delta_k||)`` of eq. (4) from the update norms alone
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


def update_norm(update: Update) -> float:
    """``||Delta_k||_2`` over the floating-point arrays of one update (float64)."""
    total = 0.0
    for array in update:
        if _is_float(array):
            flat = array.ravel().astype(np.float64, copy=False)
            total += float(flat @ flat)
    return float(np.sqrt(total))


def scaled(update: Update, factor: float) -> list[np.ndarray]:
    """``factor * Delta_k`` on the floating-point arrays; integer arrays are kept as they are."""
    return [(array * array.dtype.type(factor)) if _is_float(array) else array
            for array in update]


# --- one metric per site: the best round's score rules -----------------------------------

#: The fraction of the sites' values the trimmed mean cuts at each end (at least one from 3 sites).
TRIM_FRACTION = 0.2


#: The robust rules by their run-config name (``best-round.aggregate``).
ROBUST_RULES: Registry[Callable[[Sequence[float]], float]] = Registry(
    "robust score rule", "best-round.aggregate")


@ROBUST_RULES.register("median")
def site_median(values: Sequence[float]) -> float:
    """The median of the sites' ``values`` (finite, at least one): eq. (1) on a scalar."""
    return float(coordinate_median(np.asarray(values, np.float64)[:, None])[0])


@ROBUST_RULES.register("trimmed-mean")
def site_trimmed_mean(values: Sequence[float]) -> float:
    """The trimmed mean of the sites' ``values`` (finite, at least one), see the module."""
    n = len(values)
    cut = max(1, math.floor(TRIM_FRACTION * n)) if n >= 3 else 0
    return float(np.mean(np.sort(np.asarray(values, np.float64))[cut:n - cut]))


#: The choices of run config ``best-round.aggregate``: ``auto`` (the site vote),
#: ``site-vote`` (:mod:`strategies.site_vote`), ``mean`` (example-weighted) or a robust rule.
SCORE_RULES = ("auto", "site-vote", "mean", *ROBUST_RULES)
