"""The errors of secure aggregation: a protocol failure and a bad setting."""

from __future__ import annotations

from strategies.wire.errors import ConfigError, ReplyError

__all__ = ["SecAggConfigError", "SecAggError"]


class SecAggError(ReplyError):
    """A stage's entries, a share or a reconstruction fails the SecAgg+ protocol.

    At a site it refuses the stage (the message names the entry or the neighbour
    index, never a secret); at the coordinator it drops one reply, or fails the
    round's aggregation when the sum cannot be unmasked (the message names the sites).
    """


class SecAggConfigError(ConfigError):
    """A ``secagg.*`` setting out of range; the message names the key."""
