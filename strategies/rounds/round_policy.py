"""Straggler-tolerant rounds: a deadline and a quorum instead of waiting for everyone.

Flower's ``Grid.send_and_receive`` waits for every reply or a single timeout.
A :class:`RoundPolicy` closes an exchange (:func:`strategies.rounds.exchange.exchange`)

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
    """When a round stops waiting.

    Attributes
    ----------
    deadline : float
        Seconds after which the round closes once ``quorum`` valid replies are
        in; 0 means no deadline (wait for all, up to ``timeout``).
    quorum : int
        Valid replies needed to close at the deadline; 0 means "all selected".
    timeout : float
        Hard limit in seconds; the round closes with whatever came in.
    poll_interval : float
        Seconds between pulls (default 0.1 s: a reply waits 0.05 s on average
        before the ServerApp asks for it; each pull is one request to the
        SuperLink, or a lookup in simulation's in-memory grid).
    """

    deadline: float = 0.0
    quorum: int = 0
    timeout: float = 600.0
    poll_interval: float = 0.1

    def __post_init__(self) -> None:
        if self.deadline < 0 or self.timeout <= 0 or self.quorum < 0:
            raise ValueError(f"invalid round policy {self}")
