"""Declarative, deterministic faults of one virtual site of the in-process engine.

A real federation meets slow hospitals, crashing ClientApps and SuperNodes that
go away; :class:`SiteFaults` describes them for one virtual site so that a test
or a benchmark can replay them exactly. Rounds are the server round that the
instruction carries (config ``server-round``, :mod:`strategies.wire.message_keys`);
an instruction without one counts as round 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.wire.errors import ConfigError, SiteError
from strategies.wire.message_keys import SECAGG_STAGES

__all__ = ["InjectedFault", "SiteFaults"]


@dataclass(frozen=True)
class SiteFaults:
    """What goes wrong at one virtual site (the default: nothing).

    Attributes
    ----------
    latency : float
        Seconds of real time between the site's answer and the moment its reply
        can be pulled (a slow link or a slow site): a round's ``round.deadline``
        and ``round.quorum`` see it as a reply that has not come yet. For a site
        that is gone, the seconds until the SuperLink answers in its place (its
        heartbeat expiring).
    fail_from_round : int or None
        From this round on the handler is not called: :class:`InjectedFault` is
        raised in its place and the engine answers as a SuperNode does for a
        ClientApp that raised (an error reply, ``CLIENT_APP_RAISED_EXCEPTION``).
    silent_from_round : int or None
        From this round on the site takes instructions and never replies.
    disconnect_from_round : int or None
        From this round on the site's SuperNode is gone: an instruction of this
        round or later is answered by the SuperLink with ``NODE_UNAVAILABLE``,
        and once the federation has sent any instruction of this round the node
        is no longer listed by ``get_node_ids``.
    silent_stages : tuple of str
        SecAgg+ stages (config ``secagg-stage``: ``setup``, ``share-keys``,
        ``collect``, ``unmask``) whose instructions the site takes and never
        answers, every round: a site that drops out in the middle of a secure
        round (``("unmask",)``: after its masked input was sent).
    """

    latency: float = 0.0
    fail_from_round: int | None = None
    silent_from_round: int | None = None
    disconnect_from_round: int | None = None
    silent_stages: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = sorted(set(self.silent_stages) - set(SECAGG_STAGES))
        if unknown:
            raise ConfigError(f"SiteFaults.silent_stages: {unknown} are not SecAgg+ stages "
                              f"({', '.join(SECAGG_STAGES)})")
        if self.latency < 0:
            raise ConfigError(f"SiteFaults.latency must be >= 0, got {self.latency}")
        for name in ("fail_from_round", "silent_from_round", "disconnect_from_round"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"SiteFaults.{name} must be >= 0 or None, got {value}")

    def fails(self, server_round: int) -> bool:
        """Whether the handler fails on an instruction of ``server_round``."""
        return _reached(self.fail_from_round, server_round)

    def silent(self, server_round: int, stage: str = "") -> bool:
        """Whether an instruction of ``server_round`` (of SecAgg+ ``stage``) goes unanswered."""
        return _reached(self.silent_from_round, server_round) or stage in self.silent_stages

    def disconnected(self, server_round: int) -> bool:
        """Whether the site's node is gone at ``server_round``."""
        return _reached(self.disconnect_from_round, server_round)


class InjectedFault(SiteError):
    """Raised in place of the site's handler by :attr:`SiteFaults.fail_from_round`."""


def _reached(start: int | None, server_round: int) -> bool:
    return start is not None and server_round >= start
