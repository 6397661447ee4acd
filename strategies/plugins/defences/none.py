"""No defence: the aggregator sees the accepted replies as they are."""

from __future__ import annotations

from strategies.plugins.options import Plugin
from strategies.plugins.registries import DEFENCES
from strategies.replies import TrainReply


@DEFENCES.register("none")
class NoDefence(Plugin):
    """Keep every accepted reply unchanged (no options)."""

    #: Nothing is compared across replies: a linear aggregator behind it streams.
    needs_all_updates = False

    def filter(self, replies: list[TrainReply]) -> tuple[list[TrainReply], dict[str, float]]:
        """Return the replies and nothing to track."""
        return list(replies), {}
