"""A round's train updates on their way to the aggregate, behind the defence: folded as they
arrive, or held (bounded).

The defence stands in front of the aggregator (:func:`with_defence`,
:class:`DefendedAggregator`): ``strategy.defence`` filters the accepted replies
(norm-bound scales an update, Multi-Krum keeps a subset), judging each update as it
enters the aggregate, scaled by the aggregator's ``update_scale`` (FedNova's
normalised update ``tau ||a_i||_1^{-1} delta_i``; FedAvg's update itself), and
the aggregator weights what it kept. Once the round is aggregated, the defence
observes the norms of the kept, defended updates (norm-bound's history of
accepted norms). A second channel of the replies (SCAFFOLD's ``Delta c_i``) is
defended and combined by the same two plug-ins (:func:`split_defence`).

Server memory stays O(model) however many sites reply when the aggregator is
linear (``needs_all_updates = False``: FedAvg, FedNova, alone or behind a defence
that treats each update on its own -- norm-bound with an absolute bound only).
Each accepted reply is folded into one float64 running sum
(:class:`strategies.aggregation.RunningSum`; the aggregator's ``fold``, which
also returns the values to track, e.g. a clip factor) the moment it is
validated, while the round is still collecting (the stream is the train
intake's :class:`~strategies.rounds.reply_intake.ReplySink`); the reply is kept
without its decoded update, and the reply message is not kept at all
(:func:`strategies.rounds.instructions.exchange`). The aggregator's ``finish``
scales the sum at the end (FedAvg: ``S / sum_i n_i``). The held-set aggregation
(:func:`strategies.aggregation.fedavg_delta`) is the same fold over the whole set;
``fednova_delta`` equals it to float rounding.

An aggregator (or a defence in front of it) that needs every update of the
round at once -- the coordinate-wise median and trimmed mean (Yin et al., ICML
2018), Multi-Krum's pairwise distances (Blanchard et al., NeurIPS 2017),
norm-bound's ``kappa x median`` bound (Sun et al. 2019; the default defence) --
says so with ``needs_all_updates = True`` (:mod:`strategies.plugins.protocols`).
Its updates are held until the aggregation, and the round is refused before
anything is sent when the selected sites' updates, ``m x`` the model's bytes,
would exceed run config ``round.max-held-mb``.

Sizes are capped relative to the others when there is no roster
(:meth:`strategies.rounds.site_book.SiteBook.relative_cap`: at most run config
``federation.max-size-ratio`` x the median of the other sites' first
declarations). A reply folded on arrival can only be weighted with what is known
then, so a round with a selected site whose size is not known yet (round 1, a
newcomer; :meth:`~strategies.rounds.site_book.SiteBook.sizes_pending`) is held
like a robust rule's, within the same bound, and its replies are capped when it
closes, before :meth:`UpdateStream.finish` aggregates them; once every selected
site has declared, the caps are fixed and each reply is capped as it is folded.
The default defence (norm-bound with ``kappa``) holds every round anyway. Each
capped size is recorded as ``size-cap/<site>`` (the examples it was weighted
with).

No reply can end the run (:func:`aggregate_safely`): every reply was validated on
its own (:mod:`strategies.rounds.reply_intake`), yet the aggregator can still refuse the set (a
weight out of range, a robust rule that rejects an update) with a
:class:`strategies.wire.errors.ReplyError`. When the error names the reply at fault
(:class:`strategies.aggregation.AggregationError`'s ``index``), that reply is
dropped with the reason and the others are aggregated again; otherwise the round
keeps the old model and records why (``AggregateOutcome.failure``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from logging import WARNING

import numpy as np
from flwr.supercore import log

from strategies.aggregation import AggregationError, RunningSum, check_update
from strategies.plugins.defences.none import NoDefence
from strategies.plugins.protocols import Aggregator, Defence
from strategies.robust import update_norm
from strategies.rounds.reply_intake import TrainReply
from strategies.rounds.site_book import MAX_SIZE_RATIO_KEY, SiteBook
from strategies.wire.errors import ConfigError, ReplyError

__all__ = ["DEFAULT_MAX_HELD_MB", "MAX_HELD_KEY", "AggregateOutcome", "DefendedAggregator",
           "UpdateStream", "aggregate_safely", "split_defence", "with_defence"]

#: The run-config key bounding the updates held for an aggregator that needs them all.
MAX_HELD_KEY = "round.max-held-mb"
DEFAULT_MAX_HELD_MB = 4096.0
_MB = 2.0 ** 20


class DefendedAggregator:
    """``aggregate(replies)``: ``defence.filter`` first, then ``aggregator.aggregate``.

    Parameters
    ----------
    defence : Defence
        A ``strategy.defence`` plug-in (``filter(replies, scales) -> (replies, info)``,
        ``observe(accepted_norms)``).
    aggregator : Aggregator
        A ``strategy.aggregator`` plug-in (``aggregate(replies) -> (delta, info)``,
        ``update_scale(reply)``; ``fold`` and ``finish`` too when it streams).

    Notes
    -----
    The defence judges each update as it enters the aggregate: scaled by the
    aggregator's ``update_scale`` (FedNova's normalised update
    ``tau ||a_i||_1^{-1} delta_i``; FedAvg's update itself). Once the round is
    aggregated, the defence observes the norms of the kept, defended updates
    (norm-bound's history of accepted norms); a round whose aggregation raises
    teaches it nothing, and the strategy restores the whole object when the new
    model is refused (:mod:`strategies.rounds.train_stage`).

    Streams (:class:`UpdateStream`) when both plug-ins do: a
    defence that treats each update on its own (norm-bound without ``kappa``) and
    a linear aggregator. Otherwise every update of the round is held (Multi-Krum
    compares every pair; norm-bound's ``kappa`` takes the lower median of the
    round's norms), bounded by run config ``round.max-held-mb``.
    """

    #: Its name in checkpoints written before it moved here
    #: (:func:`strategies.rounds.checkpoint.decode_tree`): the default defence's round resumes.
    former_types = ("strategies.plugins.defences.defended.DefendedAggregator",)

    def __init__(self, defence: Defence, aggregator: Aggregator) -> None:
        self.defence, self.aggregator = defence, aggregator
        #: Streaming: the norm of each folded update (by node id) until the round's finish.
        self._folded_norms: dict[int, float] = {}

    def _scaled_norm(self, reply: TrainReply) -> float:
        """``||s_i Delta_i||`` of a defended update as it enters the aggregate."""
        return update_norm(reply.delta) * self.aggregator.update_scale(reply)

    def aggregate(self, replies: list[TrainReply]) -> tuple[list[np.ndarray], dict[str, float]]:
        """Return the aggregated update of the defended replies and both plug-ins' info."""
        kept, info = self.defence.filter(replies, [self.update_scale(r) for r in replies])
        delta, more = self.aggregator.aggregate(kept)
        learnt = self.defence.observe([self._scaled_norm(r) for r in kept])
        return delta, {**info, **more, **learnt}

    def update_scale(self, reply: TrainReply) -> float:
        """The aggregator's factor on ``reply``'s update."""
        return self.aggregator.update_scale(reply)

    @property
    def needs_all_updates(self) -> bool:
        """Whether the defence or the aggregator needs the round's set of updates."""
        return self.defence.needs_all_updates or self.aggregator.needs_all_updates

    def fold(self, total: RunningSum, reply: TrainReply, index: int) -> dict[str, float]:
        """The defence on ``reply`` alone, then the aggregator's fold; the defence's info."""
        kept, info = self.defence.filter([reply], [self.update_scale(reply)])
        for defended in kept:
            self.aggregator.fold(total, defended, index)
            self._folded_norms[defended.node_id] = self._scaled_norm(defended)
        return info

    def finish(self, total: RunningSum,
               replies: list[TrainReply]) -> tuple[list[np.ndarray], dict[str, float]]:
        """The aggregator's finish over the folded ``replies``; the defence observes them."""
        delta, info = self.aggregator.finish(total, replies)
        norms = [self._folded_norms[r.node_id] for r in replies if r.node_id in self._folded_norms]
        self._folded_norms = {}
        return delta, {**info, **self.defence.observe(norms)}


def with_defence(defence: Defence, aggregator: Aggregator) -> Aggregator:
    """``aggregator`` behind ``defence``; the aggregator itself when the defence is ``none``."""
    if isinstance(defence, NoDefence):
        return aggregator
    return DefendedAggregator(defence, aggregator)


def split_defence(aggregator: Aggregator) -> tuple[Defence, Aggregator]:
    """The defence in front of ``aggregator`` (:func:`with_defence`) and the aggregator behind
    it: ``none`` and ``aggregator`` itself when it has no defence. A second channel of the
    replies (SCAFFOLD's ``Delta c_i``) is defended and combined by these two as the update is."""
    if isinstance(aggregator, DefendedAggregator):
        return aggregator.defence, aggregator.aggregator
    return NoDefence(), aggregator


@dataclass
class AggregateOutcome:
    """The aggregated update of a round, or why there is none.

    Attributes
    ----------
    delta : list of numpy.ndarray or None
        The update ``Delta`` to apply (``None`` when aggregation failed).
    info : dict[str, float]
        The aggregator's values to track (e.g. ``tau-eff``).
    used : list of TrainReply
        The replies aggregated (those the aggregator did not reject).
    failure : str
        Why the round keeps the old model; empty when ``delta`` is usable.
    """

    delta: list[np.ndarray] | None
    info: dict[str, float] = field(default_factory=dict)
    used: list[TrainReply] = field(default_factory=list)
    failure: str = ""


def aggregate_safely(aggregator: Aggregator, replies: list[TrainReply],
                     dropped: dict[str, str]) -> AggregateOutcome:
    """``aggregator.aggregate(replies)``, dropping each reply it names as at fault.

    A :class:`ReplyError` with an ``index`` drops ``replies[index]`` into
    ``dropped`` (by site name) and retries with the rest; one without is
    returned as the round's failure, as is a round whose every reply was dropped.
    """
    used = list(replies)
    while used:
        try:
            delta, info = aggregator.aggregate(used)
        except ReplyError as exc:
            index = exc.index if isinstance(exc, AggregationError) else None
            if index is None or not 0 <= index < len(used):
                return AggregateOutcome(None, used=used,
                                        failure=f"aggregation failed: {exc}")
            culprit = used.pop(index)
            dropped[culprit.site] = f"rejected by the aggregation: {exc}"
            log(WARNING, "aggregate_train: dropped reply of %s: %s", culprit.site, exc)
            continue
        return AggregateOutcome(list(delta), dict(info), used)
    return AggregateOutcome(None, failure="aggregation failed: it rejected every reply")


class UpdateStream:
    """Folds each admitted train reply into the aggregate, or holds it when the rule needs all.

    Parameters
    ----------
    max_held_mb : float
        Run config ``round.max-held-mb``: the most MiB of updates a round may hold
        for an aggregator with ``needs_all_updates``.
    """

    def __init__(self, max_held_mb: float = DEFAULT_MAX_HELD_MB) -> None:
        self.max_held_mb = max_held_mb
        self.aggregator = None
        self._reference: list[np.ndarray] = []
        self._total: RunningSum | None = None
        self._folded: list[TrainReply] = []
        self._info: dict[str, float] = {}
        self._book: SiteBook | None = None

    @property
    def streaming(self) -> bool:
        """Whether this round's replies are folded on arrival (a linear aggregator, sizes known)."""
        return self._total is not None

    def start(self, aggregator: Aggregator, reference: list[np.ndarray],
              selected: Sequence[int], book: SiteBook | None = None) -> None:
        """Begin a round of ``aggregator`` on the global model ``reference`` for the
        ``selected`` nodes, whose sizes ``book`` caps relative to the others (none: no
        relative cap).

        Raises
        ------
        ConfigError
            The round must hold its updates (the aggregator needs them all, or a
            selected site's size is not known yet) and ``len(selected)`` x the
            model's bytes exceed ``round.max-held-mb``.
        """
        self.aggregator, self._reference, self._folded = aggregator, list(reference), []
        self._info, self._book = {}, book
        pending = book is not None and book.sizes_pending(selected)
        if not aggregator.needs_all_updates and not pending:
            self._total = RunningSum(reference)
            return
        self._total = None
        count, model_mb = len(selected), sum(array.nbytes for array in reference) / _MB
        if count * model_mb <= self.max_held_mb:
            return
        if aggregator.needs_all_updates:
            why = f"{type(aggregator).__name__} needs all {count} selected sites' updates at once"
            fix = "aggregate with fedavg / fednova and no defence, which stream"
        else:
            why = (f"the round holds all {count} selected sites' updates until each has "
                   "declared its size")
            fix = f"give a roster ('federation.roster') or set '{MAX_SIZE_RATIO_KEY}' = 0"
        raise ConfigError(
            f"run config key '{MAX_HELD_KEY}' = {self.max_held_mb:g}: {why} ({count} x "
            f"{model_mb:.1f} MB = {count * model_mb:.0f} MB); raise '{MAX_HELD_KEY}', select "
            f"fewer sites ('selection.m') or {fix}")

    def admit(self, reply: TrainReply) -> TrainReply | str:
        """Fold ``reply`` (streaming) and release its update, or keep it as it is (held).

        Returns the reply to keep (its ``delta`` emptied once folded) or, when the
        aggregator rejects it, the reason it is dropped.
        """
        if self._total is None:
            return reply
        reply = self._capped(reply)
        index = len(self._folded)
        try:
            check_update(index, reply.delta, self._reference, "the global model")
            info = self.aggregator.fold(self._total, reply, index)
        except ReplyError as exc:
            return f"rejected by the aggregation: {exc}"
        self._info.update(info)
        self._folded.append(replace(reply, delta=[]))
        return self._folded[-1]

    def _capped(self, reply: TrainReply) -> TrainReply:
        """``reply`` capped relative to the others' sizes, the cap recorded as ``size-cap/<site>``."""
        if self._book is None:
            return reply
        capped = self._book.relatively_capped(reply)
        if capped is not reply:
            self._info[f"size-cap/{reply.site}"] = float(capped.num_examples)
        return capped

    def finish(self, accepted: list[TrainReply], dropped: dict[str, str]) -> AggregateOutcome:
        """The round's aggregate: the scaled running sum, or the held ``accepted`` aggregated.

        Held replies are capped relative to the others first; those the aggregator rejects go to ``dropped`` (:func:`aggregate_safely`).
        """
        if self._total is None:
            outcome = aggregate_safely(self.aggregator, [self._capped(r) for r in accepted],
                                       dropped)
            outcome.info = {**self._info, **outcome.info}
            return outcome
        if not self._folded:
            return AggregateOutcome(None)
        delta, info = self.aggregator.finish(self._total, self._folded)
        return AggregateOutcome(list(delta), {**self._info, **info}, list(self._folded))
