"""Power-of-Choice client selection: train the sites where the global model is worst.

Cho, Wang, Joshi, "Towards Understanding Biased Client Selection in Federated
Learning", AISTATS 2022, Alg. 1: draw a candidate set of ``d`` sites with
probability proportional to their data size (without replacement), get the
current global model's loss at each candidate, and train the ``m`` with the
highest loss (:func:`strategies.selection.power_of_choice`). The sizes are the site
book's, held to its relative cap
(:meth:`strategies.rounds.site_book.SiteBook.capped_sizes`): a site that answers a query with ``num-examples = 1e15`` was a candidate in 28 of 29
rounds (``d = 2`` of 5), now in 22 of 29 (3x an honest size: 0.71 expected; honest 0.4).

* ``pow-d`` asks each candidate for the loss on its training data with a cheap
  Flower ``query`` message (forward passes only);
* ``cpow-d`` does the same on a small random subset of each candidate's data (its
  size ``selection.subset``; the site draws it afresh for every query, issue #28);
* ``rpow-d`` sends no extra message: it uses each site's last reported training
  loss, and sites never selected come first.

``m = 0`` trains ``ceil(fraction-train x connected)`` sites. ``d = 0`` makes d adaptive: all sites in round 1, decreasing linearly to ``m``
by the last round (:func:`strategies.selection.adaptive_d`), trading early speed
for the final error floor. A fairness floor (``fairness_rounds = R``) makes every
site train at least once every R rounds (:func:`strategies.selection.fairness_floor`).
The options are the run config's ``selection`` section
(:class:`strategies.plugins.selectors.options.SelectionOptions`).
"""

from __future__ import annotations

import math

import numpy as np

from strategies.plugins.registries import SELECTORS
from strategies.plugins.run_settings import RunSettings
from strategies.plugins.selectors.options import SelectionOptions
from strategies.wire.plugin_options import Plugin, PluginError
from strategies.selection import (
    adaptive_d,
    fairness_floor,
    power_of_choice,
    sample_candidates,
)


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
