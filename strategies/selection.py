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

__all__ = ["SelectionError", "power_of_choice", "sample_candidates", "uniform_sample"]

T = TypeVar("T")


class SelectionError(ValueError):
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
