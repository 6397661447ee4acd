"""The global model's normalisation statistics and step counters, checked after aggregation.

A BatchNorm layer's ``running_mean`` and ``running_var`` are not trained: they are
estimates a site's forward passes write, and its ``num_batches_tracked`` counts
those passes. A site's update of them is small next to the weights' (an L2 norm
bound rarely clips it) and no rule of the aggregation keeps them meaningful, so
one site can make the mean of two updates drive a variance below 0 (the network
then outputs NaN in eval mode: ``(x - mu) / sqrt(var + eps)``) or send
int64's minimum as its counter update (issue #29, found 3). The server
recognises them by the global model's array names (the ``ArrayRecord`` keys, a
torch ``state_dict``'s names, :data:`VARIANCE`, :data:`MEAN`, :data:`COUNTER`)
and, each round (:class:`RoundStatistics`):

A. **rebased** first, when the sites started from another model than the global one
   (:meth:`RoundStatistics.rebase`; a compressed downlink's reference
   :math:`\hat x`, :mod:`strategies.downlink`): a site's statistics update is then
   relative to :math:`\hat x`, and it is made relative to the global model :math:`x`
   (``delta + x - hat x`` at the statistics), so that the new statistics are the
   aggregate of what the sites measured, ``hat x - delta_i``, as with a dense downlink.
   Why (issue 50, the top-k downlink's NaN, cxr-cls seed 1): a statistic is an
   estimate, not a gradient step; after tau BatchNorm steps a site's variance is
   ``a hat v + (1 - a) D`` (``a = (1 - momentum)^tau``, ``D`` its data's), so its update
   says "go to D" from wherever :math:`\hat v` is. Applied to :math:`x` unrebased it moved
   :math:`x` that far again each round the top-k step left the channel stale at the
   sites (the server residual grew linearly), past the data's variance to below 0:
   round 3 refused every honest reply (step 0) and the model's statistics were
   garbage (AUC 0.41; before step 0 existed, every site's validation loss was NaN).
0. **each reply**: an update that would make a variance of the round's model
   negative is refused whole (:meth:`RoundStatistics.reply_problem`): a site's own
   variances are >= 0, so no honest site sends it;
1. **robust rule** (when a defence is on: the aggregator is a
   :class:`~strategies.rounds.update_stream.DefendedAggregator`): the
   coordinate-wise median of the statistics updates of the replies the defence
   kept replaces the aggregator's weighted mean at those positions (Yin et al.,
   ICML 2018, Def. 1, :func:`strategies.robust.coordinate_median`;
   unweighted, so a claimed example count buys no weight, and fewer than half the
   sites cannot move it).
   With two sites the median is their mean, hence step 2. The defence and the
   aggregator then see each reply with its statistics updates zeroed
   (:meth:`RoundStatistics.admit`): its norm is that of the learnt weights.
2. **validation** of the new statistics, entry by entry: an entry that the update
   would make negative (a variance) or non-finite (a variance or a mean) keeps its
   previous value, with a warning naming the array and the count (tracked as
   ``statistics-repaired``). Entry by entry rather than refusing the round's
   statistics: the other entries are honest sites' estimates, and a kept old entry
   is a valid estimate of its channel.
3. **counters bounded**: an honest site's counter advances by one per local step,
   at most tau (its update is ``-steps``), so the new counter is the old one
   advanced by the aggregate's increment clipped to ``[0, tau]``, tau the round's
   planned local steps (the arrays clipped are tracked as ``counters-bounded``).
   The counter stays meaningful (BatchNorm reads it with ``momentum=None``, its
   cumulative average) and can never overflow or go back.

Pure numpy: the names are strings, nothing of torch is imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from logging import WARNING

import numpy as np
from flwr.supercore import log

from strategies.robust import coordinate_median
from strategies.rounds.reply_intake import ReplySink, TrainReply

__all__ = ["COUNTER", "MEAN", "VARIANCE", "RoundStatistics", "StatisticPositions"]

#: The name endings of a normalisation layer's buffers (torch ``state_dict`` names).
VARIANCE, MEAN, COUNTER = "running_var", "running_mean", "num_batches_tracked"


def _named(key: str, ending: str) -> bool:
    return key == ending or key.endswith("." + ending)


@dataclass(frozen=True)
class StatisticPositions:
    """Where a model's statistics are: positions of its float variances and means and of
    its integer counters, in the model's array order."""

    variances: tuple[int, ...] = ()
    means: tuple[int, ...] = ()
    counters: tuple[int, ...] = ()

    @classmethod
    def of(cls, keys: Sequence[str], arrays: Sequence[np.ndarray]) -> StatisticPositions:
        """The positions of ``keys`` (the global model's array names) that are statistics."""
        def where(ending: str, kinds: str) -> tuple[int, ...]:
            return tuple(j for j, (key, array) in enumerate(zip(keys, arrays))
                         if _named(key, ending) and array.dtype.kind in kinds)
        return cls(where(VARIANCE, "f"), where(MEAN, "f"), where(COUNTER, "iu"))

    @property
    def estimates(self) -> tuple[int, ...]:
        """The float statistics (means and variances), in model order."""
        return tuple(sorted(self.variances + self.means))

    def __bool__(self) -> bool:
        return bool(self.variances or self.means or self.counters)


class RoundStatistics:
    """A round's statistics: kept from each admitted reply, settled after aggregation.

    The train intake's sink (:class:`~strategies.rounds.reply_intake.ReplySink`):
    it passes each reply to ``sink`` (the update stream) and, when the robust rule
    is on, keeps a copy of the reply's statistics updates (small: one entry per
    channel), which a streaming aggregator would otherwise release once folded.

    Parameters
    ----------
    sink : ReplySink
        Where the replies go (:class:`~strategies.rounds.update_stream.UpdateStream`).
    """

    def __init__(self, sink: ReplySink[TrainReply]) -> None:
        self.sink = sink
        self.keys: list[str] = []
        self.positions = StatisticPositions()
        self.robust = False
        self.kept: dict[int, list[np.ndarray]] = {}
        self.reference: list[np.ndarray] = []
        self.offsets: dict[int, np.ndarray] = {}

    def start(self, keys: Sequence[str], reference: Sequence[np.ndarray], robust: bool) -> None:
        """A new round on the global model ``reference`` named ``keys``; ``robust``: a
        defence is on (the median rule)."""
        self.keys, self.robust, self.kept = list(keys), robust, {}
        self.reference, self.offsets = list(reference), {}
        self.positions = StatisticPositions.of(keys, reference)

    def rebase(self, trained_from: Sequence[np.ndarray] | None) -> None:
        """The model this round's sites start from when it is not the round's model
        (rule A of the module docstring); ``None``: the round's model itself. Call after
        :meth:`start`, before the first reply.

        Raises
        ------
        ValueError
            When ``trained_from`` does not have the round's model's arrays and shapes.
        """
        self.offsets = {}
        if trained_from is None:
            return
        if len(trained_from) != len(self.reference) or any(
                np.shape(a) != np.shape(b) for a, b in zip(trained_from, self.reference)):
            raise ValueError("normalisation statistics: the model the sites train from "
                             "does not have the round's model's arrays")
        for j in self.positions.estimates:
            offset = (self.reference[j].astype(np.float64)
                      - np.asarray(trained_from[j]).astype(np.float64))
            if np.any(offset != 0):
                self.offsets[j] = offset

    def rebased(self, reply: TrainReply) -> TrainReply:
        """``reply`` with its statistics updates relative to the round's model (rule A)."""
        if not self.offsets:
            return reply
        delta = list(reply.delta)
        for j, offset in self.offsets.items():
            if j < len(delta) and np.shape(delta[j]) == offset.shape:
                delta[j] = (delta[j].astype(np.float64) + offset).astype(delta[j].dtype)
        return replace(reply, delta=delta)

    def admit(self, reply: TrainReply) -> TrainReply | str:
        """``sink.admit(reply)``; under the robust rule its statistics updates are kept
        aside and the sink gets the reply with them zeroed.

        The median (step 1) replaces the aggregate at those positions, so the defence
        and the aggregator see the learnt weights only: a BatchNorm variance update is
        large next to the weights' (a fresh model's variances move from 1 towards the
        data's), and counted in the defence's norms it lets a boosted update through
        at many times the honest weights' norm (issue #29's attack table: x1000 at 3
        sites, clipped to 3x the median norm, still moved the weights 12x).
        """
        reply = self.rebased(reply)
        problem = self.reply_problem(reply)
        if problem is not None:
            return problem
        statistics = None
        if self.robust and self.positions.estimates:
            statistics = [np.array(reply.delta[j], copy=True) for j in self.positions.estimates]
            zeroed = set(self.positions.estimates)
            reply = replace(reply, delta=[np.zeros_like(array) if j in zeroed else array
                                          for j, array in enumerate(reply.delta)])
        kept = self.sink.admit(reply)
        if not isinstance(kept, str) and statistics is not None:
            self.kept[reply.node_id] = statistics
        return kept

    def reply_problem(self, reply: TrainReply) -> str | None:
        """Why ``reply`` cannot be an honest site's update (``None``: it can).

        An honest site's own model, ``x - delta_i``, has every variance >= 0 (BatchNorm
        writes a running average of batch variances), so a reply whose variance update
        makes one negative on the round's model is refused whole, naming the array
        (float32 rounding of a variance near 0 is tolerated: ``1e-6 + 1e-5 |var|``).
        With two sites the median is their mean and could not stop it (issue #29's
        attack table, ``running-var``); a refused reply weighs nothing at any count.
        """
        for j in self.positions.variances:
            if j >= len(reply.delta) or j >= len(self.reference):
                continue
            var = self.reference[j].astype(np.float64)
            with np.errstate(over="ignore", invalid="ignore"):
                new = var - reply.delta[j].astype(np.float64)
            below = new < -(1e-6 + 1e-5 * np.abs(var))
            if np.any(below):
                return (f"normalisation statistics rule: the update makes "
                        f"{int(np.count_nonzero(below))} entr"
                        f"{'y' if np.count_nonzero(below) == 1 else 'ies'} of '{self.keys[j]}' "
                        f"negative (lowest {float(np.min(new)):.4g}); a site's own variances "
                        "are >= 0")
        return None

    def settle(self, reference: Sequence[np.ndarray], delta: Sequence[np.ndarray],
               used: Sequence[TrainReply], tau: int) -> tuple[list[np.ndarray], dict[str, float]]:
        """The round's update ``delta`` with its statistics settled (steps 1-3 above);
        ``used``: the replies aggregated that the defence did not leave out.

        Returns the update and what to track (``statistics-repaired``: entries kept at
        their previous value; ``counters-bounded``: counters whose increment was
        clipped to ``[0, tau]``); both empty of change for a model without statistics.
        """
        delta = list(delta)
        if not self.positions:
            return delta, {}
        if self.robust:
            self._median(delta, used)
        repaired = sum(self._keep_valid(reference, delta, j, nonnegative=True)
                       for j in self.positions.variances)
        repaired += sum(self._keep_valid(reference, delta, j, nonnegative=False)
                        for j in self.positions.means)
        bounded = sum(self._bound_counter(reference, delta, j, tau)
                      for j in self.positions.counters)
        return delta, {"statistics-repaired": float(repaired), "counters-bounded": float(bounded)}

    def _median(self, delta: list[np.ndarray], used: Sequence[TrainReply]) -> None:
        """Eq. (1) of Yin et al. over the used replies' kept statistics updates."""
        rows = [self.kept.get(reply.node_id) for reply in used]
        if not rows or any(row is None for row in rows):
            return
        for i, j in enumerate(self.positions.estimates):
            stack = np.stack([row[i].ravel() for row in rows]).astype(np.float64)
            delta[j] = coordinate_median(stack).reshape(delta[j].shape).astype(delta[j].dtype)

    def _keep_valid(self, reference: Sequence[np.ndarray], delta: list[np.ndarray], j: int,
                    nonnegative: bool) -> int:
        """Zero the entries of ``delta[j]`` whose new value is invalid; how many."""
        with np.errstate(over="ignore", invalid="ignore"):
            new = (reference[j] - delta[j]).astype(reference[j].dtype)
            bad = ~np.isfinite(new) | ((new < 0) if nonnegative else False)
        count = int(np.count_nonzero(bad))
        if count:
            delta[j] = np.where(bad, 0, delta[j]).astype(delta[j].dtype)
            log(WARNING, "aggregate_train: %d entr%s of '%s' kept at the previous value "
                "(the aggregate made %s)", count, "y" if count == 1 else "ies", self.keys[j],
                "them negative or non-finite" if nonnegative else "them non-finite")
        return count

    def _bound_counter(self, reference: Sequence[np.ndarray], delta: list[np.ndarray], j: int,
                       tau: int) -> int:
        """Clip counter ``j``'s increment ``-delta[j]`` to ``[0, tau]``; 1 when it was clipped."""
        dtype = reference[j].dtype
        increment = -delta[j].astype(np.float64)  # float64: -int64.min does not overflow
        headroom = np.iinfo(dtype).max - np.maximum(reference[j], 0)  # exact, in the dtype
        clipped = np.minimum(np.clip(increment, 0.0, float(max(tau, 0))).astype(dtype), headroom)
        if np.array_equal(clipped, increment):
            return 0
        delta[j] = (-clipped).astype(delta[j].dtype)
        log(WARNING, "aggregate_train: '%s' advanced by %s, not the aggregate's %s (at most "
            "tau = %d local steps)", self.keys[j], clipped.tolist(), increment.tolist(), tau)
        return 1
