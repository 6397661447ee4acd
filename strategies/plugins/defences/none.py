"""No defence: the aggregator sees the accepted replies as they are."""

from __future__ import annotations

from collections.abc import Sequence

from strategies.plugins.registries import DEFENCES
from strategies.rounds.reply_intake import TrainReply
from strategies.wire.plugin_options import Plugin


@DEFENCES.register("none")
class NoDefence(Plugin):
    """Keep every accepted reply unchanged (no options)."""

    #: Nothing is compared across replies: a linear aggregator behind it streams.
    needs_all_updates = False

    def filter(self, replies: list[TrainReply],
               scales: Sequence[float] | None = None) -> tuple[list[TrainReply], dict[str, float]]:
        """Return the replies and nothing to track (``scales`` are not needed)."""
        return list(replies), {}

    def observe(self, accepted_norms: Sequence[float]) -> dict[str, float]:
        """Nothing is learnt across rounds."""
        return {}
