"""An aggregator behind a defence: the defence filters the replies, the aggregator weights them."""

from __future__ import annotations

import numpy as np

from strategies.plugins.defences.none import NoDefence
from strategies.replies import TrainReply

__all__ = ["DefendedAggregator", "with_defence"]


class DefendedAggregator:
    """``aggregate(replies)``: ``defence.filter`` first, then ``aggregator.aggregate``.

    Parameters
    ----------
    defence : object
        A ``strategy.defence`` plug-in (``filter(replies) -> (replies, info)``).
    aggregator : object
        A ``strategy.aggregator`` plug-in (``aggregate(replies) -> (delta, info)``).
    """

    def __init__(self, defence, aggregator) -> None:
        self.defence, self.aggregator = defence, aggregator

    def aggregate(self, replies: list[TrainReply]) -> tuple[list[np.ndarray], dict[str, float]]:
        """Return the aggregated update of the defended replies and both plug-ins' info."""
        kept, info = self.defence.filter(replies)
        delta, more = self.aggregator.aggregate(kept)
        return delta, {**info, **more}


def with_defence(defence, aggregator):
    """``aggregator`` behind ``defence``; the aggregator itself when the defence is ``none``."""
    if isinstance(defence, NoDefence):
        return aggregator
    return DefendedAggregator(defence, aggregator)
