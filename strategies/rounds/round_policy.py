"""Straggler-tolerant rounds: a deadline and a quorum instead of waiting for everyone.

Flower's ``Grid.send_and_receive`` waits for every reply or a single timeout.
A :class:`RoundPolicy` closes the round

* as soon as every selected site has answered, or
* at the ``deadline`` (seconds after sending) if at least ``quorum`` *valid*
  replies are in, or
* at the hard ``timeout`` whatever came in.

Replies that arrive after the round closed are *late*: their message ids are
kept, pulled at the start of the next collection, dropped and logged, so a slow
site is visible in MLflow rather than silently ignored.

When a site's SuperNode is gone (its heartbeat expired), the SuperLink answers
in its place with an error reply whose ``src_node_id`` is the SuperLink's own
id; :func:`collect_replies` attributes such a reply to the node the
instruction was sent to, so the failure is recorded under the site's name.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from flwr.app import Message
from flwr.serverapp import Grid

__all__ = ["RoundPolicy", "Collected", "collect_replies"]


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


@dataclass
class Collected:
    """Outcome of one collection."""

    replies: list[Message] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    late: list[Message] = field(default_factory=list)
    seconds: float = 0.0
    #: Per reply (same order as ``replies``), seconds from the push to the pull that got it.
    reply_seconds: list[float] = field(default_factory=list)


def _attribute(reply: Message, node_id: int | None) -> Message:
    """Set the source of an error reply the SuperLink sent for ``node_id`` to that node.

    Flower answers for an unreachable node itself (``NODE_UNAVAILABLE``, with
    the SuperLink's node id as source); replies from the node are unchanged.
    """
    if (node_id is not None and reply.has_error()
            and reply.metadata.src_node_id != node_id):
        reply.metadata.__dict__["_src_node_id"] = node_id
    return reply


def collect_replies(
    grid: Grid,
    messages: Iterable[Message],
    policy: RoundPolicy,
    is_valid: Callable[[Message], bool],
    late_ids: dict[str, int],
) -> Collected:
    """Push ``messages`` and pull replies under ``policy``.

    ``late_ids`` maps message ids of earlier rounds still unanswered to the node
    each was sent to; replies to them are returned in ``Collected.late`` (and
    removed from it), and this round's unanswered messages are added to it.
    Error replies the SuperLink sends for an unreachable node are attributed to
    that node (see :func:`_attribute`).
    """
    messages = list(messages)
    started = time.monotonic()
    result = Collected()
    if late_ids:
        for reply in grid.pull_messages(list(late_ids)):
            node = late_ids.pop(reply.metadata.reply_to_message_id, None)
            result.late.append(_attribute(reply, node))
    if not messages:
        return result
    pending = {mid: m.metadata.dst_node_id
               for mid, m in zip(grid.push_messages(messages), messages)}
    quorum = policy.quorum or len(pending)
    valid = 0
    while pending:
        for reply in grid.pull_messages(list(pending)):
            node = pending.pop(reply.metadata.reply_to_message_id, None)
            if node is None:
                continue
            result.replies.append(_attribute(reply, node))
            result.reply_seconds.append(time.monotonic() - started)
            valid += bool(is_valid(reply))
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
    result.seconds = time.monotonic() - started
    return result
