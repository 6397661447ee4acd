"""No secure aggregation: each site's update reaches the coordinator on its own."""

from __future__ import annotations

from strategies.plugins.registries import SECURE_AGGREGATION
from strategies.wire.plugin_options import Plugin


@SECURE_AGGREGATION.register("none")
class NoSecureAggregation(Plugin):
    """The plain round (no options): the updates are sent in the clear."""

    #: No SecAgg+ settings: the round sends and aggregates each site's update.
    settings = None
