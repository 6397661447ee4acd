"""THE exchange of a round: instructions out, replies in under the round policy, each taken once.

One function serves every message the server sends: train and evaluate in each
round, Power-of-Choice's ``query`` (:mod:`.round_metrics`), the end-of-run
test and cross-site evaluations (:mod:`.cross_site`) and a vertical federation's
stages (:mod:`app.vertical.messages`). :func:`exchange` pushes
the instructions and pulls the replies every ``poll_interval`` until the
:class:`~strategies.rounds.round_policy.RoundPolicy` closes it; each reply is
handed to the :class:`~strategies.rounds.reply_intake.ReplyIntake` the moment it
is pulled (parsed, identity-checked, capped, folded: once), so that whether it
counts toward the quorum is known at once and no message is kept.

Replies that arrive after the exchange closed are *late*: the caller keeps their
message ids (``late_ids``), the next exchange pulls them first, records them
and drops them, so a slow site is visible in MLflow rather than silently ignored.

When a site's SuperNode is gone (its heartbeat expired), the SuperLink answers
in its place with an error reply whose ``src_node_id`` is the SuperLink's own
id; the exchange hands such a reply to the intake as the answer of the node the
instruction was sent to, so the failure is recorded under the site's name.

Before a round the server waits for the sites (:func:`wait_for_nodes`), also
bounded: Flower's ``sample_nodes`` loops forever until ``min_available_nodes``
SuperNodes are connected, so a federation whose hospital never comes up would
hang silently; here the wait has a deadline and fails with a clear error.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from logging import INFO
from typing import Generic

from flwr.app import Message
from flwr.serverapp import Grid
from flwr.supercore import log

from strategies.rounds.reply_intake import Reply, ReplyIntake, Taken
from strategies.rounds.round_policy import RoundPolicy
from strategies.wire.errors import FederationError

__all__ = ["Exchanged", "NodeWaitTimeout", "exchange", "wait_for_nodes"]


@dataclass
class Exchanged(Generic[Reply]):
    """What one exchange brought back.

    Attributes
    ----------
    taken : Taken
        The typed accepted replies, the drops with their reasons, the policies.
    late : list[str]
        Names of the replies to earlier exchanges pulled (and dropped) this time.
    missing : list[int]
        Nodes that had not answered when the exchange closed.
    reply_seconds : dict[str, float]
        Per site name, seconds from the push to the pull that got its reply.
    seconds : float
        Seconds the exchange took.
    """

    taken: Taken[Reply]
    late: list[str] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    reply_seconds: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


def exchange(grid: Grid, messages: Iterable[Message], policy: RoundPolicy,
             intake: ReplyIntake[Reply], late_ids: dict[str, int] | None = None
             ) -> Exchanged[Reply]:
    """Push ``messages``, pull their replies under ``policy``, take each into ``intake``.

    ``late_ids`` maps message ids of earlier exchanges still unanswered to the
    node each was sent to: replies to them are pulled first, named in
    ``Exchanged.late`` and removed from it; this exchange's unanswered messages
    are added to it (``None``: no late replies are tracked).
    """
    messages = list(messages)
    started = time.monotonic()
    late_ids = {} if late_ids is None else late_ids
    late: list[str] = []
    if late_ids:
        for reply in grid.pull_messages(list(late_ids)):
            node = late_ids.pop(reply.metadata.reply_to_message_id, None)
            late.append(intake.label(reply, reply.metadata.src_node_id if node is None
                                     else node))
    result: Exchanged[Reply] = Exchanged(Taken(), late=late)
    pending = ({mid: m.metadata.dst_node_id
                for mid, m in zip(grid.push_messages(messages), messages)}
               if messages else {})
    quorum = policy.quorum or len(pending)
    valid = 0
    while pending:
        for reply in grid.pull_messages(list(pending)):
            node = pending.pop(reply.metadata.reply_to_message_id, None)
            if node is None:
                continue
            name, counts = intake.take(reply, node)
            result.reply_seconds[name] = time.monotonic() - started
            valid += counts
        if not pending:
            break
        elapsed = time.monotonic() - started
        if policy.deadline and elapsed >= policy.deadline and valid >= quorum:
            break
        if elapsed >= policy.timeout:
            break
        time.sleep(policy.poll_interval)
    result.missing = sorted(pending.values())
    late_ids.update(pending)
    result.taken = intake.close()
    result.seconds = time.monotonic() - started
    return result


class NodeWaitTimeout(FederationError, TimeoutError):
    """Fewer sites than required connected before the deadline."""


def wait_for_nodes(
    grid: Grid, min_nodes: int, timeout: float, poll_interval: float = 1.0
) -> list[int]:
    """Return the connected node ids once at least ``min_nodes`` are connected.

    Raises
    ------
    NodeWaitTimeout
        If fewer than ``min_nodes`` are connected after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    last_logged = -1
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= min_nodes:
            return nodes
        if time.monotonic() >= deadline:
            raise NodeWaitTimeout(
                f"only {len(nodes)} of the required {min_nodes} sites connected "
                f"within {timeout:.0f} s; check that the SuperNodes are running and "
                "can reach the SuperLink, or lower min-nodes"
            )
        if len(nodes) != last_logged:
            log(INFO, "Waiting for sites: %d of %d connected", len(nodes), min_nodes)
            last_logged = len(nodes)
        time.sleep(poll_interval)
