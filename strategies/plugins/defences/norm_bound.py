"""Per-update L2 norm bound before aggregation (``strategy.defence = "norm-bound"``, the default).

Sun, Kairouz, Suresh, McMahan, *Can You Really Backdoor Federated Learning?*,
NeurIPS FL workshop 2019, Sec. 3: each update is scaled to

    Delta_k * min(1, M / ||Delta_k||_2)                                   (1)

with ``M`` the smallest of (:func:`strategies.robust.round_bound`):

* ``norm-bound.absolute`` (0: none);
* ``norm-bound.kappa`` x the **lower median** of the round's update norms (0: none;
  for an even count the lower middle norm). With two sites it is the smaller
  norm: a x1000 attacker is scaled to ``kappa`` x the honest norm, and the smaller
  site cannot raise the bound. (The plain median of two norms is half the
  attacker's own norm: with ``kappa = 3`` a x1000 update was not clipped at all.)
* from round 2 on, ``norm-bound.history-kappa`` x the median of the norms accepted
  (after clipping) in the last ``norm-bound.history-rounds`` rounds (0: none):
  a reference one site cannot move when it is alone in a round, or is a majority
  of one (1 site of 1, or of 2 in a round where the other failed).

Why this design (#29): it holds for any number of sites, 1 included, with the
default configuration and no roster; it needs no bound learnt from outside the
federation; and it does not hurt a clean run: honest updates shrink over
training, so a reference from earlier rounds lies above the honest norms of later
rounds, and an honest site is clipped only when its update is over ``kappa``
(1.5) times the round's lower median norm or three times the reference.

Why ``kappa = 1.5`` by default: sites that run the same local steps send updates
of similar norms, but a network with normalisation layers is fragile to a
longer step from one site. In the attack table (``bench/robustness.py``,
PneumoniaMNIST, 3 sites, seed 0) one site's update x3 (what ``kappa = 3`` let
through) took the global model's validation AUC from 0.83 to 0.50 after one
round; x2 gave 0.79 and x1.5 0.83. With ``kappa = 1.5`` the clean run costs
0.1% AUC there, and a x1000 update lands within 1% of the clean run at 2, 3 and
10 sites.

Norms are taken over the floating-point arrays (integer buffers are kept), of
the update as the aggregator takes it in: ``filter``'s ``scales`` (the
aggregator's :meth:`~strategies.plugins.protocols.Aggregator.update_scale`:
FedNova's normalised update ``tau ||a_i||_1^{-1} delta_i``, 1 for FedAvg).
The clipped replies keep their example counts and a-norms. Tracked per round:
``norm-bound`` (``M``), ``norm-bound-reference`` (the history's median, when
known) and ``clip-factor/<site>`` (``min(1, M / ||Delta_k||)``, 1 = not clipped).
The history is the defence's state (:attr:`NormBoundDefence.history`): a
checkpoint saves it and a resumed federation goes on with it.

Memory: with ``kappa`` (the default) the bound needs every norm of the round, so
the round's updates are held (bounded by run config ``round.max-held-mb``); with
``norm-bound.kappa = 0`` (absolute and history bounds) each update is clipped on
its own and a linear aggregator streams (:mod:`strategies.rounds.update_stream`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from strategies.plugins.registries import DEFENCES
from strategies.rounds.reply_intake import TrainReply
from strategies.robust import NormBound, clip_factors, history_reference, scaled, update_norm
from strategies.wire.plugin_options import Plugin, PluginOptions, option


@dataclass(frozen=True)
class NormBoundOptions(PluginOptions):
    """Run-config section ``norm-bound``.

    Attributes
    ----------
    absolute : float
        ``norm-bound.absolute``: the bound ``M`` itself (> 0), or 0 for none.
    kappa : float
        ``norm-bound.kappa``: ``M = kappa x`` the lower median of the round's update
        norms (>= 1), or 0 for none. At least one of the two must be set.
    history_kappa : float
        ``norm-bound.history-kappa``: from round 2 on, ``M`` is also at most
        ``history_kappa x`` the median of the norms accepted in the last
        ``history_rounds`` rounds (>= 1), or 0 for none.
    history_rounds : int
        ``norm-bound.history-rounds``: the rounds whose accepted norms make the reference.
    """

    section = "norm-bound"
    absolute: float = option(0.0, at_least=0.0)
    kappa: float = option(1.5, at_least=0.0)
    history_kappa: float = option(3.0, at_least=0.0)
    history_rounds: int = option(5, at_least=1)

    def check(self) -> None:
        """A finite absolute bound; kappa and history-kappa 0 or >= 1; absolute or kappa set."""
        if not math.isfinite(self.absolute):
            self.fail("absolute", "must be a finite number >= 0 (0 = no absolute bound)")
        if not math.isfinite(self.kappa) or 0.0 < self.kappa < 1.0:
            self.fail("kappa", "must be 0 (no relative bound) or a finite number >= 1")
        if not math.isfinite(self.history_kappa) or 0.0 < self.history_kappa < 1.0:
            self.fail("history_kappa", "must be 0 (no bound from earlier rounds) or a finite "
                                       "number >= 1")
        if self.absolute == 0.0 and self.kappa == 0.0:
            self.fail("kappa", "must be >= 1 when 'norm-bound.absolute' is 0 (one bound "
                               "is needed)")

    def bound(self) -> NormBound:
        """The :class:`NormBound` of these options."""
        return NormBound(absolute=self.absolute or None, kappa=self.kappa or None,
                         history_kappa=self.history_kappa or None)


@DEFENCES.register("norm-bound")
class NormBoundDefence(Plugin):
    """Scale each update to at most the round's bound ``M`` (eq. 1); learn the accepted norms."""

    Options = NormBoundOptions

    def __init__(self, absolute: float = 0.0, kappa: float = 1.5, history_kappa: float = 3.0,
                 history_rounds: int = 5) -> None:
        options = NormBoundOptions(absolute=absolute, kappa=kappa, history_kappa=history_kappa,
                                   history_rounds=history_rounds)
        self.bound, self.history_rounds = options.bound(), options.history_rounds
        #: The norms accepted (after clipping) in each of the last ``history_rounds`` rounds.
        self.history: list[list[float]] = []

    @property
    def needs_all_updates(self) -> bool:
        """``kappa`` needs the round's norms; absolute and history bounds treat each on its own."""
        return self.bound.kappa is not None

    def filter(self, replies: list[TrainReply],
               scales: Sequence[float] | None = None) -> tuple[list[TrainReply], dict[str, float]]:
        """Return the replies with their updates clipped, ``M``, the reference and the clip
        factor per site; ``scales[k]`` multiplies reply ``k``'s update as the aggregator
        takes it in (its norm is measured so, the clip factor applies to the update)."""
        if not replies:
            return [], {}
        scales = [1.0] * len(replies) if scales is None else scales
        norms = np.array([update_norm(r.delta) * s for r, s in zip(replies, scales)])
        reference = history_reference(self.history) if self.bound.history_kappa else None
        factors, bound = clip_factors(norms, self.bound, reference)
        clipped = [r if factor >= 1.0 else replace(r, delta=scaled(r.delta, factor))
                   for r, factor in zip(replies, factors)]
        info = {"norm-bound": bound}
        if reference is not None:
            info["norm-bound-reference"] = reference
        info.update({f"clip-factor/{r.site}": float(f) for r, f in zip(replies, factors)})
        return clipped, info

    def observe(self, accepted_norms: Sequence[float]) -> dict[str, float]:
        """Keep the round's accepted norms as the newest of the last ``history_rounds``."""
        if self.bound.history_kappa and accepted_norms:
            self.history = [*self.history, [float(n) for n in accepted_norms]][
                -self.history_rounds:]
        return {}
