"""Straggler-tolerant rounds: a deadline and a quorum instead of waiting for everyone.

Flower's ``Grid.send_and_receive`` waits for every reply or a single timeout.
A :class:`RoundPolicy` closes an exchange (:func:`strategies.rounds.instructions.exchange`)

* as soon as every selected site has answered, or
* at the ``deadline`` (seconds after sending) if at least ``quorum`` *valid*
  replies are in, or
* at the hard ``timeout`` whatever came in.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RoundPolicy"]


@dataclass(frozen=True)
class RoundPolicy:
    """When an exchange stops waiting (run config ``round.deadline``, ``round.quorum``,
    ``round-timeout``); ``ValueError`` for a negative deadline or quorum, or a timeout <= 0."""

    #: Seconds after which the exchange closes once ``quorum`` valid replies are in;
    #: 0: no deadline (wait for all, up to ``timeout``).
    deadline: float = 0.0
    #: Valid replies needed to close at the deadline; 0: all selected.
    quorum: int = 0
    #: Hard limit in seconds: the exchange closes with whatever came in.
    timeout: float = 600.0
    #: Seconds between pulls: a reply waits half of it on average before the ServerApp
    #: asks for it; each pull is one request to the SuperLink (a lookup in process).
    poll_interval: float = 0.1

    def __post_init__(self) -> None:
        if self.deadline < 0 or self.timeout <= 0 or self.quorum < 0:
            raise ValueError(f"invalid round policy {self}")
