"""Multi-Krum selection before aggregation (``strategy.defence = "multi-krum"``).

Blanchard, El Mhamdi, Guerraoui, Stainer, *Machine Learning with Adversaries:
Byzantine Tolerant Gradient Descent*, NeurIPS 2017, Sec. 4: with ``n``
updates of which at most ``f`` are Byzantine, score each by the sum of squared
distances to its ``n - f - 2`` nearest neighbours and keep the ``m`` of lowest
score (:func:`strategies.robust.krum_scores`). The kept replies are then
aggregated with the aggregator's own weights (FedAvg, FedNova), which is
Multi-Krum's average when the aggregator is FedAvg. Distances use the
floating-point arrays (:func:`strategies.robust.float_stack`) of the updates as the
aggregator takes them in (``filter``'s ``scales``: FedNova's normalised update).

With fewer replies than the options assume, ``f`` is lowered to ``n - 1`` and
``m`` to ``n`` for that round (a round with one reply keeps it). Tracked per
round: ``krum-kept`` and ``krum-selected/<site>`` (1 kept, 0 left out).

Memory: the pairwise distances need every update at once, as one ``(n, d)``
float64 stack (:func:`strategies.robust.float_stack`; ``d`` = the model's
float entries): ``8 n d`` bytes on top of the ``n`` decoded updates, plus the
``n x n`` distances; ``n`` is the replies accepted, at most the selected count
``selection.m``, so the bound is linear in ``m`` and independent of the number
of connected sites (e.g. ``m = 10`` and the 0.55 MB float32 cxr-cls model: an 11 MB stack).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from strategies.plugins.registries import DEFENCES
from strategies.rounds.reply_intake import TrainReply
from strategies.robust import float_stack, krum_scores, lowest_scores
from strategies.wire.plugin_options import Plugin, PluginOptions, option


@dataclass(frozen=True)
class MultiKrumOptions(PluginOptions):
    """Run-config section ``multi-krum``.

    Attributes
    ----------
    f : int
        ``multi-krum.f``: the number of Byzantine sites assumed (>= 0).
    m : int
        ``multi-krum.m``: replies kept per round (>= 1), or 0 for ``n - f``.
    """

    section = "multi-krum"
    f: int = option(1, at_least=0)
    m: int = option(0, at_least=0)


@DEFENCES.register("multi-krum")
class MultiKrumDefence(Plugin):
    """Keep the ``m`` replies of lowest Krum score."""

    Options = MultiKrumOptions
    #: Krum scores compare every pair of the round's updates: they are all held.
    needs_all_updates = True

    def __init__(self, f: int = 1, m: int = 0) -> None:
        options = MultiKrumOptions(f=f, m=m)
        self.f, self.m = options.f, options.m

    def filter(self, replies: list[TrainReply],
               scales: Sequence[float] | None = None) -> tuple[list[TrainReply], dict[str, float]]:
        """Return the kept replies (in their original order) and who was kept; ``scales[k]``
        multiplies update ``k`` as the aggregator takes it in (distances are measured so)."""
        if not replies:
            return [], {}
        n = len(replies)
        f = min(self.f, n - 1)
        m = min(self.m or n - f, n)
        stack = float_stack([r.delta for r in replies])
        if scales is not None:
            stack *= np.asarray(scales, dtype=np.float64)[:, None]
        kept = set(lowest_scores(krum_scores(stack, f), m).tolist())
        info = {"krum-kept": float(len(kept))}
        info.update({f"krum-selected/{r.site}": float(i in kept) for i, r in enumerate(replies)})
        return [r for i, r in enumerate(replies) if i in kept], info

    def observe(self, accepted_norms: Sequence[float]) -> dict[str, float]:
        """Nothing is learnt across rounds."""
        return {}
