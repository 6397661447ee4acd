"""Per-update L2 norm bound before aggregation (``strategy.defence = "norm-bound"``).

Sun, Kairouz, Suresh, McMahan, *Can You Really Backdoor Federated Learning?*,
NeurIPS FL workshop 2019, Sec. 3: each update is scaled to

    Delta_k * min(1, M / ||Delta_k||_2)                                   (1)

with ``M`` an absolute bound (``norm-bound.absolute``) and/or ``kappa`` times
the median of the round's update norms (``norm-bound.kappa``; the smaller
holds), :mod:`strategies.robust.norm_bound`. Norms are taken over the
floating-point arrays; integer buffers are kept.
The clipped replies keep their example counts and a-norms, so FedAvg and
FedNova weight them as before. Tracked per round: ``norm-bound`` (``M``) and
``clip-factor/<site>`` (``min(1, M / ||Delta_k||)``, 1 = not clipped).

Memory: with ``kappa`` (the default) the bound needs every norm of the round, so
the round's updates are held (bounded by run config ``round.max-held-mb``); with
an absolute bound only (``norm-bound.kappa = 0``) each update is clipped on its own
and a linear aggregator streams (:mod:`strategies.rounds.update_stream`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from strategies.plugins.options import Plugin, PluginOptions, option
from strategies.plugins.registries import DEFENCES
from strategies.replies import TrainReply
from strategies.robust import NormBound, clip_factors, scaled, update_norm


@dataclass(frozen=True)
class NormBoundOptions(PluginOptions):
    """Run-config section ``norm-bound``.

    Attributes
    ----------
    absolute : float
        ``norm-bound.absolute``: the bound ``M`` itself (> 0), or 0 for none.
    kappa : float
        ``norm-bound.kappa``: ``M = kappa x`` the median of the round's update
        norms (>= 1), or 0 for none. At least one of the two must be set.
    """

    section = "norm-bound"
    absolute: float = option(0.0, at_least=0.0)
    kappa: float = option(3.0, at_least=0.0)

    def check(self) -> None:
        """A finite absolute bound; kappa 0 or >= 1; at least one bound."""
        if not math.isfinite(self.absolute):
            self.fail("absolute", "must be a finite number >= 0 (0 = no absolute bound)")
        if not math.isfinite(self.kappa) or 0.0 < self.kappa < 1.0:
            self.fail("kappa", "must be 0 (no relative bound) or a finite number >= 1")
        if self.absolute == 0.0 and self.kappa == 0.0:
            self.fail("kappa", "must be >= 1 when 'norm-bound.absolute' is 0 (one bound "
                               "is needed)")

    def bound(self) -> NormBound:
        """The :class:`NormBound` of these options."""
        return NormBound(absolute=self.absolute or None, kappa=self.kappa or None)


@DEFENCES.register("norm-bound")
class NormBoundDefence(Plugin):
    """Scale each update to at most the round's bound ``M`` (eq. 1)."""

    Options = NormBoundOptions

    def __init__(self, absolute: float = 0.0, kappa: float = 3.0) -> None:
        self.bound = NormBoundOptions(absolute=absolute, kappa=kappa).bound()

    @property
    def needs_all_updates(self) -> bool:
        """``kappa`` needs the median of the round's norms; an absolute bound alone does not."""
        return self.bound.kappa is not None

    def filter(self, replies: list[TrainReply]) -> tuple[list[TrainReply], dict[str, float]]:
        """Return the replies with their updates clipped, ``M`` and the clip factor per site."""
        if not replies:
            return [], {}
        norms = np.array([update_norm(r.delta) for r in replies])
        factors, bound = clip_factors(norms, self.bound)
        clipped = [r if factor >= 1.0 else replace(r, delta=scaled(r.delta, factor))
                   for r, factor in zip(replies, factors)]
        info = {"norm-bound": bound}
        info.update({f"clip-factor/{r.site}": float(f) for r, f in zip(replies, factors)})
        return clipped, info
