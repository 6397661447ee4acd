"""An aggregator behind a defence: the defence filters the replies, the aggregator weights them."""

from __future__ import annotations

import numpy as np

from strategies.aggregation import RunningSum
from strategies.plugins.defences.none import NoDefence
from strategies.plugins.protocols import Aggregator, Defence
from strategies.replies import TrainReply
from strategies.robust import update_norm

__all__ = ["DefendedAggregator", "split_defence", "with_defence"]


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

    Streams (:mod:`strategies.rounds.update_stream`) when both plug-ins do: a
    defence that treats each update on its own (norm-bound without ``kappa``) and
    a linear aggregator. Otherwise every update of the round is held (Multi-Krum
    compares every pair; norm-bound's ``kappa`` takes the lower median of the
    round's norms), bounded by run config ``round.max-held-mb``.
    """

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
