"""Client (site) selection: uniform sampling and Power-of-Choice.

Power-of-Choice (Cho, Wang, Joshi 2022) selects sites in two stages:

1. sample a candidate set of ``d`` sites without replacement with probability
   proportional to their data fraction :math:`p_k` (:func:`sample_candidates`);
2. ask the candidates for their current local loss (a cheap ``query`` message)
   and keep the ``m <= d`` with the highest loss (:func:`power_of_choice`).

References
----------
.. [1] Cho, Wang, Joshi, "Towards Understanding Biased Client Selection in
   Federated Learning", AISTATS 2022.

Notes
-----
Pure numpy: this module must not import torch, MONAI, Flower or the client /
model layers.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from numbers import Integral, Real
from typing import TypeVar

import numpy as np
from strategies.wire.errors import ConfigError

__all__ = [
    "SelectionError",
    "adaptive_d",
    "fairness_floor",
    "power_of_choice",
    "sample_candidates",
    "uniform_sample",
]

T = TypeVar("T")


class SelectionError(ConfigError):
    """Raised for invalid inputs to a client selector."""


def _check_count(value: object, name: str, available: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise SelectionError(f"{name} must be an int, got {value!r}")
    count = int(value)
    if count < 1:
        raise SelectionError(f"{name} must be >= 1, got {count}")
    if count > available:
        raise SelectionError(f"{name}={count} exceeds the {available} available sites")
    return count


def _check_distinct(items: Sequence[object], name: str) -> None:
    if all(isinstance(item, Hashable) for item in items) and len(set(items)) != len(items):
        raise SelectionError(f"{name} contains duplicates: {list(items)!r}")


def _check_rng(rng: object) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise SelectionError(
            f"rng must be a numpy.random.Generator, got {type(rng).__name__}"
        )
    return rng


def power_of_choice(candidates: Sequence[T], losses: Sequence[float], m: int) -> list[T]:
    r"""Return the ``m`` candidates with the highest current local loss.

    Second stage of Power-of-Choice (Cho et al. 2022 [1]_, the ``pow-d``
    strategy): from the candidate set :math:`\mathcal{A}` of size ``d``,
    select the ``m`` clients with the largest :math:`F_k(w)`,

    .. math:: S = \arg\text{top-}m_{k \in \mathcal{A}}\; F_k(w).

    Parameters
    ----------
    candidates : sequence
        Candidate site ids (distinct).
    losses : sequence of float
        Their current local losses, same order; must be finite.
    m : int
        Number of sites to select, ``1 <= m <= len(candidates)``.

    Returns
    -------
    list
        The ``m`` selected candidates in descending loss order. Ties are broken
        by candidate order (earlier first), so the result is deterministic.

    Raises
    ------
    SelectionError
        On unequal lengths, duplicate candidates, non-finite losses or ``m``
        out of range.
    """
    if len(candidates) != len(losses):
        raise SelectionError(
            f"{len(candidates)} candidates but {len(losses)} losses (must be equal)"
        )
    _check_distinct(candidates, "candidates")
    count = _check_count(m, "m", len(candidates))
    values: list[float] = []
    for i, loss in enumerate(losses):
        if isinstance(loss, bool) or not isinstance(loss, Real) or not math.isfinite(loss):
            raise SelectionError(f"loss of candidate {candidates[i]!r} is not finite: {loss!r}")
        values.append(float(loss))
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))
    return [candidates[i] for i in order[:count]]


def sample_candidates(
    sites: Sequence[T],
    data_fractions: Sequence[float],
    d: int,
    rng: np.random.Generator,
) -> list[T]:
    r"""Draw ``d`` distinct sites with probability proportional to data fraction.

    First stage of Power-of-Choice (Cho et al. 2022 [1]_, ``pow-d``): the
    candidate set is sampled without replacement from the distribution
    :math:`p_k = n_k / \sum_j n_j` (successive draws, each renormalised over
    the remaining sites, as ``numpy.random.Generator.choice`` does).

    Parameters
    ----------
    sites : sequence
        Site ids (distinct).
    data_fractions : sequence of float
        Nonnegative, finite weights (need not sum to 1); at least ``d`` of them
        must be positive. A site with weight 0 is never drawn.
    d : int
        Candidate-set size, ``1 <= d <= len(sites)``.
    rng : numpy.random.Generator
        Source of randomness (seed it for reproducible rounds).

    Returns
    -------
    list
        The ``d`` sampled sites, in draw order.

    Raises
    ------
    SelectionError
        On unequal lengths, duplicate sites, invalid weights or ``d`` out of range.
    """
    if len(sites) != len(data_fractions):
        raise SelectionError(
            f"{len(sites)} sites but {len(data_fractions)} data fractions (must be equal)"
        )
    _check_distinct(sites, "sites")
    count = _check_count(d, "d", len(sites))
    generator = _check_rng(rng)
    weights = np.asarray(data_fractions, dtype=np.float64)
    if not np.isfinite(weights).all() or (weights < 0).any():
        raise SelectionError(
            f"data fractions must be finite and >= 0, got {list(data_fractions)!r}"
        )
    positive = int(np.count_nonzero(weights))
    if positive < count:
        raise SelectionError(
            f"only {positive} sites have a positive data fraction, cannot draw d={count}"
        )
    picks = generator.choice(len(sites), size=count, replace=False, p=weights / weights.sum())
    return [sites[int(i)] for i in picks]


def uniform_sample(sites: Sequence[T], m: int, rng: np.random.Generator) -> list[T]:
    """Draw ``m`` distinct sites uniformly at random (FedAvg's client sampling).

    Parameters
    ----------
    sites : sequence
        Site ids (distinct).
    m : int
        Number of sites, ``1 <= m <= len(sites)``.
    rng : numpy.random.Generator
        Source of randomness.

    Returns
    -------
    list
        The ``m`` sampled sites, in draw order.

    Raises
    ------
    SelectionError
        On duplicate sites or ``m`` out of range.
    """
    _check_distinct(sites, "sites")
    count = _check_count(m, "m", len(sites))
    picks = _check_rng(rng).choice(len(sites), size=count, replace=False)
    return [sites[int(i)] for i in picks]


def adaptive_d(server_round: int, num_rounds: int, num_sites: int, m: int) -> int:
    """Candidate-set size decreasing linearly from all sites to ``m`` over the run.

    Cho et al. 2022 [1]_ (Sec. 5, "adaptive d"): a large ``d`` early makes the
    selection strongly loss-biased and converges fast; shrinking it to ``m``
    removes the bias, and with it the higher error floor, by the end.
    ``d_r = round(N - (N - m) (r - 1) / (R - 1))`` for rounds ``r = 1..R``.
    """
    if not 1 <= m <= num_sites:
        raise SelectionError(f"need 1 <= m <= number of sites, got m={m}, N={num_sites}")
    if server_round < 1 or num_rounds < 1:
        raise SelectionError(f"rounds count from 1, got {server_round} of {num_rounds}")
    if num_rounds == 1:
        return num_sites
    progress = min(server_round - 1, num_rounds - 1) / (num_rounds - 1)
    return int(round(num_sites - (num_sites - m) * progress))


def fairness_floor(
    selected: Sequence[T],
    last_trained: dict,
    server_round: int,
    every: int,
    sites: Sequence[T],
) -> list[T]:
    """Make every site train at least once every ``every`` rounds (cross-silo fairness).

    Each site has a deadline ``last_trained + every`` (never-trained sites count
    from round 0). Earliest-deadline-first feasibility: the sites due by round
    ``r + k`` must fit in the ``m (k + 1)`` slots of rounds ``r .. r + k``, so
    this round must take ``max_k (due(r + k) - m k)`` of the earliest-deadline
    sites; the remaining slots keep the selector's own picks in their order.
    The number of selected sites ``m = len(selected)`` never changes; when
    ``N > m * every`` no schedule can meet the floor and the most overdue sites
    go first. ``every = 0`` disables the floor.
    """
    if every <= 0 or not selected:
        return list(selected)
    m = len(selected)
    deadline = {site: last_trained.get(site, 0) + every for site in sites}
    needed = 0
    for k in range(every):
        due = sum(1 for site in sites if deadline[site] <= server_round + k)
        needed = max(needed, due - m * k)
    preferred = {site: i for i, site in enumerate(selected)}
    ordered = sorted(sites, key=lambda site: (deadline[site],
                                              preferred.get(site, len(preferred))))
    forced = ordered[: min(max(needed, 0), m)]
    rest = [site for site in selected if site not in forced]
    return forced + rest[: m - len(forced)]
