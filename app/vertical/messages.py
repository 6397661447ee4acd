"""One stage of a vertical federation over Flower's grid: a message per site, replies taken once.

A stage's messages are of type ``train.vertical``
(:data:`strategies.wire.message_keys.VERTICAL_MESSAGE_TYPE`):
each site gets its own fresh ConfigRecord (the stage, the federation, the round and the
stage's entries) and its own ArrayRecord. They go through THE exchange of the rounds
(:func:`strategies.rounds.instructions.exchange`) with a
:class:`~strategies.rounds.reply_intake.ReplyIntake` whose parse is
:func:`strategies.vertical.stage_answer.parse_stage_answer`: each reply is parsed and
identity-checked once, and an unusable one (an error reply, a record of the wrong kind, an
array or metric that is no finite number) is dropped with its reason logged, as in a
horizontal round. A stage the protocol cannot finish without every site (``required``:
the PSI, ``describe``, split learning's training) then stops the federation with a
:class:`VerticalError` naming the site and the reason (a policy refusal names the rule);
one it can (pvFed's rounds, split learning's evaluation) goes on with the answers it got.
A required stage some sites did not answer within ``round-timeout`` raises
:class:`VerticalTimeout`, one line naming the round, the stage, the silent sites, the
run-config key to raise and the sizes that make the stage long (:data:`STAGE_SIZES`).
:class:`Traffic` counts the arrays' bytes each way, the figure the split-learning
benchmark compares with FedAvg's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from strategies.rounds.instructions import exchange
from strategies.rounds.reply_intake import NO_REPLY, ReplyIntake
from strategies.rounds.round_policy import RoundPolicy
from strategies.rounds.site_book import SiteBook
from strategies.vertical.stage_answer import StageAnswer, parse_stage_answer
from strategies.wire import message_keys as keys
from strategies.wire.errors import FederationError

__all__ = ["STAGE_SIZES", "Scalar", "StageAnswer", "StageRequest", "Traffic", "VerticalError",
           "VerticalTimeout", "send_stage", "timeout_error"]

#: Seconds between two pulls of the replies.
_POLL_SECONDS = 0.02

Scalar = bool | int | float | str
#: One site's part of a stage: its scalar entries and its named arrays.
StageRequest = tuple[Mapping[str, Scalar], Mapping[str, np.ndarray]]


class VerticalError(FederationError):
    """A stage that needs every site lacks one's usable answer (the site and reason named)."""


class VerticalTimeout(VerticalError):
    """A stage that needs every site did not hear from some within ``round-timeout``."""


#: Stage name prefix -> the run-config sizes that make a site's answer to it take long.
STAGE_SIZES: dict[str, str] = {
    "describe": "none (the site did not start answering: check its SuperNode's log)",
    "psi-": "the sites' patient counts (rows of table.csv)",
    "pvfed-local": "vertical.local-epochs, vertical.encoder-epochs, batch-size",
    "pvfed-round": "vertical.head-epochs, vertical.encoder-epochs",
    "split-train": "local-steps, vertical.batches-per-message, batch-size, image-size, "
                   "model-size",
    "split-head": "vertical.batches-per-message, batch-size, image-size, model-size",
    "split-eval": "the sites' val/test splits, image-size, model-size",
}


def timeout_error(stage: str, server_round: int, sites: list[str],
                  timeout: float) -> VerticalTimeout:
    """The one-line error of ``stage`` in ``server_round`` left unanswered by ``sites``."""
    sizes = next((text for prefix, text in STAGE_SIZES.items() if stage.startswith(prefix)),
                 "the stage's sizes")
    return VerticalTimeout(
        f"vertical federation timed out in round {server_round}, stage {stage!r}: no answer "
        f"from {', '.join(sites)} within round-timeout={timeout:g} s; raise run-config "
        f"'round-timeout' or lower {sizes} (docs/VERTICAL.md, 'Sizes and time per round')")


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


def send_stage(grid: Grid, stage: str, requests: Mapping[int, StageRequest], *,
               federation: str, server_round: int, timeout: float, traffic: Traffic,
               names: Mapping[int, str] | None = None, book: SiteBook | None = None,
               required: bool = True) -> dict[int, StageAnswer]:
    """Send ``stage`` to every node of ``requests``; each usable answer, by node.

    Parameters
    ----------
    requests : mapping
        Node id -> (the stage's scalar entries, its named arrays) for that node.
    names : mapping, optional
        Node id -> the site's department, for the log and errors.
    book : SiteBook, optional
        The federation's site names (a name is bound to the node that first declared it);
        a fresh one when ``None``.
    required : bool
        The protocol cannot go on without any site's answer: a dropped or missing one
        raises; otherwise the answers that came are returned (the others logged).

    Raises
    ------
    VerticalTimeout
        With ``required``: some sites did not answer within ``timeout`` seconds
        (:func:`timeout_error`: the round, the stage, those sites, what to change).
    VerticalError
        With ``required``: naming each site whose reply was unusable (the intake's reason:
        the rule of a refusal, the exception's type, the malformed record).
    """
    names = dict(names or {})
    book = book or SiteBook()
    messages, sizes = [], {}
    for node, (entries, arrays) in requests.items():
        config = ConfigRecord({**entries, keys.VERTICAL_STAGE: stage,
                               keys.FEDERATION: federation, keys.SERVER_ROUND: server_round})
        content = RecordDict({keys.CONFIG: config, keys.ARRAYS: _record(arrays)})
        messages.append(Message(content, dst_node_id=node,
                                message_type=keys.VERTICAL_MESSAGE_TYPE))
        sizes[node] = sum(int(np.asarray(a).nbytes) for a in arrays.values())
    intake = ReplyIntake(f"vertical stage {stage!r}", book, parse_stage_answer,
                         expected={node: names.get(node, book.label(node)) for node in requests})
    taken = exchange(grid, messages, RoundPolicy(timeout=timeout, poll_interval=_POLL_SECONDS),
                     intake).taken
    answers = {answer.node_id: answer for answer in taken.accepted}
    for node in requests:
        up = answers[node].arrays.values() if node in answers else ()
        traffic.count(stage, sizes[node], sum(int(a.nbytes) for a in up))
    if required and taken.dropped:
        labels = {label: node for node, label in taken.labels.items()}
        silent = [names.get(labels.get(label, -1), label)
                  for label, reason in taken.dropped.items() if reason == NO_REPLY]
        if silent:
            raise timeout_error(stage, server_round, silent, timeout)
        raise VerticalError("; ".join(
            f"vertical stage {stage!r}: {names.get(labels.get(label, -1), label)} gave no "
            f"usable reply and the stage needs every site: {reason}"
            for label, reason in taken.dropped.items()))
    return answers
