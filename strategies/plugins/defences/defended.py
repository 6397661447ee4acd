"""An aggregator behind a defence: the defence filters the replies, the aggregator weights them."""

from __future__ import annotations

import numpy as np

from strategies.aggregation import RunningSum
from strategies.plugins.defences.none import NoDefence
from strategies.plugins.protocols import Aggregator, Defence
from strategies.replies import TrainReply

__all__ = ["DefendedAggregator", "with_defence"]


class DefendedAggregator:
    """``aggregate(replies)``: ``defence.filter`` first, then ``aggregator.aggregate``.

    Parameters
    ----------
    defence : Defence
        A ``strategy.defence`` plug-in (``filter(replies) -> (replies, info)``).
    aggregator : Aggregator
        A ``strategy.aggregator`` plug-in (``aggregate(replies) -> (delta, info)``;
        ``fold`` and ``finish`` too when it streams).

    Notes
    -----
    Streams (:mod:`strategies.rounds.update_stream`) when both plug-ins do: a
    defence that treats each update on its own (norm-bound with an absolute bound
    only) and a linear aggregator. Otherwise every update of the round is held
    (Multi-Krum compares every pair; norm-bound's ``kappa`` takes the median of the
    round's norms), bounded by run config ``round.max-held-mb``.
    """

    def __init__(self, defence: Defence, aggregator: Aggregator) -> None:
        self.defence, self.aggregator = defence, aggregator

    def aggregate(self, replies: list[TrainReply]) -> tuple[list[np.ndarray], dict[str, float]]:
        """Return the aggregated update of the defended replies and both plug-ins' info."""
        kept, info = self.defence.filter(replies)
        delta, more = self.aggregator.aggregate(kept)
        return delta, {**info, **more}

    @property
    def needs_all_updates(self) -> bool:
        """Whether the defence or the aggregator needs the round's set of updates."""
        return self.defence.needs_all_updates or self.aggregator.needs_all_updates

    def fold(self, total: RunningSum, reply: TrainReply, index: int) -> dict[str, float]:
        """The defence on ``reply`` alone, then the aggregator's fold; the defence's info."""
        kept, info = self.defence.filter([reply])
        for defended in kept:
            self.aggregator.fold(total, defended, index)
        return info

    def finish(self, total: RunningSum,
               replies: list[TrainReply]) -> tuple[list[np.ndarray], dict[str, float]]:
        """The aggregator's finish over the folded ``replies``."""
        return self.aggregator.finish(total, replies)


def with_defence(defence: Defence, aggregator: Aggregator) -> Aggregator:
    """``aggregator`` behind ``defence``; the aggregator itself when the defence is ``none``."""
    if isinstance(defence, NoDefence):
        return aggregator
    return DefendedAggregator(defence, aggregator)
