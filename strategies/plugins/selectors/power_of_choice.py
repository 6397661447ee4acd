"""Power-of-Choice client selection: train the sites where the global model is worst.

Cho, Wang, Joshi, "Towards Understanding Biased Client Selection in Federated
Learning", AISTATS 2022 [1]_, Alg. 1, in two stages:

1. draw a candidate set of ``d`` sites without replacement with probability
   proportional to their data fraction :math:`p_k` (:func:`sample_candidates`);
2. get the current global model's loss at each candidate and train the
   ``m <= d`` with the highest loss (:func:`power_of_choice`).

The sizes are the site book's, held to its relative cap
(:meth:`strategies.rounds.site_book.SiteBook.capped_sizes`): a site that answers a query with ``num-examples = 1e15`` was a candidate in 28 of 29
rounds (``d = 2`` of 5), now in 22 of 29 (3x an honest size: 0.71 expected; honest 0.4).

* ``pow-d`` asks each candidate for the loss on its training data with a cheap
  Flower ``query`` message (forward passes only);
* ``cpow-d`` does the same on a small random subset of each candidate's data (its
  size ``selection.subset``; the site draws it afresh for every query, issue #28);
* ``rpow-d`` sends no extra message: it uses each site's last reported training
  loss, and sites never selected come first.

``m = 0`` trains ``ceil(fraction-train x connected)`` sites. ``d = 0`` makes d adaptive: all sites in round 1, decreasing linearly to ``m``
by the last round (:func:`adaptive_d`, Sec. 5), trading early speed
for the final error floor. A fairness floor (``fairness_rounds = R``) makes every
site train at least once every R rounds (:func:`fairness_floor`).
The options are the run config's ``selection`` section
(:class:`strategies.plugins.selectors.options.SelectionOptions`); the input checks
and :class:`~strategies.plugins.selectors.uniform.SelectionError` are uniform
sampling's (:mod:`strategies.plugins.selectors.uniform`). Pure numpy.

References
----------
.. [1] Cho, Wang, Joshi, "Towards Understanding Biased Client Selection in
   Federated Learning", AISTATS 2022.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real
from typing import TypeVar

import numpy as np

from strategies.plugins.registries import SELECTORS
from strategies.plugins.run_settings import RunSettings
from strategies.plugins.selectors.options import SelectionOptions
from strategies.plugins.selectors.uniform import (
    SelectionError,
    check_count,
    check_distinct,
    check_rng,
)
from strategies.wire.plugin_options import Plugin, PluginError

__all__ = ["CPowDSelector", "PowDSelector", "RPowDSelector", "adaptive_d",
           "fairness_floor", "power_of_choice", "sample_candidates"]

T = TypeVar("T")


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
    check_distinct(candidates, "candidates")
    count = check_count(m, "m", len(candidates))
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
    check_distinct(sites, "sites")
    count = check_count(d, "d", len(sites))
    generator = check_rng(rng)
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


class _PowerOfChoice(Plugin):
    """Shared machinery; subclasses say where the candidates' losses come from."""

    Options = SelectionOptions

    def __init__(self, m: int = 0, d: int = 0, num_rounds: int = 1, fraction: float = 1.0,
                 fairness_rounds: int = 0, subset: int = 0, seed: int = 0) -> None:
        SelectionOptions(m=m, d=d, subset=subset, fairness_rounds=fairness_rounds)  # validates
        self.m, self.d, self.num_rounds = m, d, num_rounds
        self.fraction = fraction
        self.fairness_rounds, self.subset = fairness_rounds, subset
        self._rng = np.random.default_rng(seed)
        self.last_trained: dict[int, int] = {}
        self.times_selected: dict[int, int] = {}
        self.last: dict = {}

    @classmethod
    def from_options(cls, options: SelectionOptions, settings: RunSettings) -> _PowerOfChoice:
        """The selector for a run (the ``selection`` section and the run settings)."""
        return cls(m=options.m, d=options.d, num_rounds=settings.num_rounds,
                   fraction=settings.fraction_train, fairness_rounds=options.fairness_rounds,
                   subset=options.subset, seed=settings.seed)

    def _m(self, available: int) -> int:
        m = self.m or math.ceil(self.fraction * available)  # min-nodes: sites to wait for
        return min(m, available)

    def _losses(self, candidates: list[int], ctx) -> dict[int, float]:
        raise NotImplementedError

    def select(self, server_round: int, nodes: list[int], ctx) -> list[int]:
        """Candidates by data size, then the ``m`` highest-loss ones (plus fairness)."""
        m = self._m(len(nodes))
        d = self.d or adaptive_d(server_round, self.num_rounds, len(nodes), m)
        d = max(m, min(d, len(nodes)))
        sizes = [float(ctx.sizes.get(n, 0.0)) for n in nodes]
        known = [s for s in sizes if s > 0]
        fill = float(np.mean(known)) if known else 1.0
        weights = [s if s > 0 else fill for s in sizes]
        candidates = [int(c) for c in sample_candidates(nodes, weights, d, self._rng)]
        losses = self._losses(candidates, ctx)
        answered = [c for c in candidates if c in losses]
        chosen = power_of_choice(answered, [losses[c] for c in answered],
                                 min(m, len(answered))) if answered else []
        chosen = fairness_floor(chosen, self.last_trained, server_round,
                                self.fairness_rounds, nodes)
        for node in chosen:
            self.last_trained[node] = server_round
            self.times_selected[node] = self.times_selected.get(node, 0) + 1
        self.last = {"d": d, "m": m, "candidates": candidates,
                     "losses": {c: losses[c] for c in answered}, "selected": list(chosen)}
        return sorted(chosen)


@SELECTORS.register("pow-d")
class PowDSelector(_PowerOfChoice):
    """Loss of the global model on each candidate's whole training set (query)."""

    def _losses(self, candidates: list[int], ctx) -> dict[int, float]:
        return ctx.query_losses(candidates, subset=0)


@SELECTORS.register("cpow-d")
class CPowDSelector(_PowerOfChoice):
    """Loss on a small fixed subset of each candidate's data (``subset`` examples)."""

    def __init__(self, subset: int = 32, **options) -> None:
        self.requires(SelectionOptions(subset=subset), None)
        super().__init__(subset=subset, **options)

    @staticmethod
    def requires(options: SelectionOptions, settings: RunSettings | None) -> None:
        """cpow-d asks for the loss on ``selection.subset`` examples: at least one."""
        if options.subset < 1:
            raise PluginError("run config key 'strategy.selector' = 'cpow-d' needs "
                              f"selection.subset >= 1, got {options.subset}")

    def _losses(self, candidates: list[int], ctx) -> dict[int, float]:
        return ctx.query_losses(candidates, subset=self.subset)


@SELECTORS.register("rpow-d")
class RPowDSelector(_PowerOfChoice):
    """Last reported training loss; never-selected sites first (no extra message)."""

    def _losses(self, candidates: list[int], ctx) -> dict[int, float]:
        top = max(ctx.last_losses.values(), default=0.0) + 1.0
        return {c: ctx.last_losses.get(c, top) for c in candidates}
