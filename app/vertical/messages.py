"""One stage of a vertical federation over Flower's grid: a message per site, every reply back.

A stage's messages are of type ``train.vertical`` (:data:`strategies.message_keys.VERTICAL_MESSAGE_TYPE`):
each site gets its own fresh ConfigRecord (the stage, the federation, the round and the
stage's entries) and its own ArrayRecord; the reply's ``vertical`` ArrayRecord, ``metrics``
and ``site`` records come back as a :class:`StageAnswer`. Unlike a horizontal round, a
vertical stage cannot go on without a site (the next stage needs every site's part), so a
missing or error reply stops the federation with a :class:`VerticalError` naming the site
and its reply's reason (a policy refusal names the rule). :class:`Traffic` counts the
arrays' bytes each way, the figure the split-learning benchmark compares with FedAvg's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from strategies import message_keys as keys
from strategies.errors import FederationError

__all__ = ["Scalar", "StageAnswer", "StageRequest", "Traffic", "VerticalError", "send_stage"]

#: Seconds between two pulls of the replies.
_POLL_SECONDS = 0.02

Scalar = bool | int | float | str
#: One site's part of a stage: its scalar entries and its named arrays.
StageRequest = tuple[Mapping[str, Scalar], Mapping[str, np.ndarray]]


class VerticalError(FederationError):
    """A site did not answer a vertical stage, or answered with an error (named)."""


@dataclass(frozen=True)
class StageAnswer:
    """One site's reply to a stage."""

    node_id: int
    arrays: dict[str, np.ndarray]
    metrics: dict[str, float | int]
    info: dict[str, str]


@dataclass
class Traffic:
    """Bytes of arrays sent to the sites (downlink) and back (uplink), and messages."""

    downlink_bytes: int = 0
    uplink_bytes: int = 0
    messages: int = 0
    by_stage: dict[str, dict[str, int]] = field(default_factory=dict)

    def count(self, stage: str, down: int, up: int) -> None:
        """Add one message of ``stage`` with ``down`` bytes out and ``up`` bytes back."""
        self.downlink_bytes += down
        self.uplink_bytes += up
        self.messages += 1
        row = self.by_stage.setdefault(stage, {"downlink-bytes": 0, "uplink-bytes": 0,
                                               "messages": 0})
        row["downlink-bytes"] += down
        row["uplink-bytes"] += up
        row["messages"] += 1


def _record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({name: Array(np.ascontiguousarray(a)) for name, a in arrays.items()})


def _exchange(grid: Grid, messages: list[Message], timeout: float) -> dict[int, Message]:
    """Push ``messages``, pull their replies for at most ``timeout`` s: node -> reply.

    A reply is matched by the instruction it answers (the SuperLink answers for a site
    that is gone, from its own node id).
    """
    pending = {mid: m.metadata.dst_node_id
               for mid, m in zip(grid.push_messages(messages), messages)}
    end, replies = time.monotonic() + timeout, {}
    while pending and time.monotonic() < end:
        for reply in grid.pull_messages(list(pending)):
            node = pending.pop(reply.metadata.reply_to_message_id, None)
            if node is not None:
                replies[node] = reply
        if pending:
            time.sleep(_POLL_SECONDS)
    return replies


def send_stage(grid: Grid, stage: str, requests: Mapping[int, StageRequest], *,
               federation: str, server_round: int, timeout: float, traffic: Traffic,
               names: Mapping[int, str] | None = None) -> dict[int, StageAnswer]:
    """Send ``stage`` to every node of ``requests`` and return each node's answer.

    Parameters
    ----------
    requests : mapping
        Node id -> (the stage's scalar entries, its named arrays) for that node.
    names : mapping, optional
        Node id -> the site's department, for errors.

    Raises
    ------
    VerticalError
        A site's reply is an error (its reason: the rule of a refusal, else the
        exception's type) or no reply came within ``timeout`` seconds.
    """
    names = names or {}
    messages, sizes = [], {}
    for node, (entries, arrays) in requests.items():
        config = ConfigRecord({**entries, keys.VERTICAL_STAGE: stage,
                               keys.FEDERATION: federation, keys.SERVER_ROUND: server_round})
        content = RecordDict({keys.CONFIG: config, keys.ARRAYS: _record(arrays)})
        messages.append(Message(content, dst_node_id=node,
                                message_type=keys.VERTICAL_MESSAGE_TYPE))
        sizes[node] = sum(int(np.asarray(a).nbytes) for a in arrays.values())
    replies = _exchange(grid, messages, timeout)
    answers: dict[int, StageAnswer] = {}
    for node in requests:
        site = names.get(node, f"node {node}")
        reply = replies.get(node)
        if reply is None:
            raise VerticalError(f"vertical stage {stage!r}: {site} did not answer within "
                                f"{timeout:g} s")
        if reply.has_error():
            raise VerticalError(f"vertical stage {stage!r}: {site} answered with error "
                                f"{reply.error.code}: {reply.error.reason}")
        content = reply.content
        arrays = ({name: array.numpy() for name, array in content[keys.VERTICAL].items()}
                  if keys.VERTICAL in content else {})
        metrics = dict(content[keys.METRICS]) if keys.METRICS in content else {}
        info = {k: str(v) for k, v in content[keys.SITE].items()} if keys.SITE in content else {}
        traffic.count(stage, sizes[node], sum(int(a.nbytes) for a in arrays.values()))
        answers[node] = StageAnswer(node, arrays, metrics, info)
    return answers
