"""Taking in an exchange's replies: each parsed and identity-checked exactly once.

Under a deadline and quorum (:mod:`.round_policy`) a reply must be validated as
it arrives, to know whether it counts toward the quorum; the same outcome is then
aggregated. A :class:`ReplyIntake` takes each reply message once
(:meth:`ReplyIntake.take`), for the node the instruction was sent to:

1. its *label*, the name it is recorded under (:func:`reply_label`);
2. its parse into a typed value (``TrainReply``, ``MetricsReply``), or the
   :class:`InvalidReplyError` that says why it is unusable;
3. the site book's identity check (:meth:`SiteBook.identity_problem`: a name is
   bound to the node that first declared it);
4. its ``num-examples`` capped by the book (train or evaluate caps, :class:`Cap`);
   evaluate replies are also capped relative to the others' declarations when the
   exchange closes (:meth:`SiteBook.relative_cap`: every declaration is known then;
   the train stage's update stream caps train replies);
5. with a :class:`ReplySink`, its admission: the train stage's update stream
   folds the update into the running aggregate there and keeps the reply without
   it (:mod:`strategies.rounds.update_stream`), so the decoded updates are not
   held until the exchange closes.

The message itself is only read, never changed, and not kept: the intake keeps
the typed replies. :meth:`ReplyIntake.close` adds the selected sites that never
answered and hands back the exchange's :class:`Taken` replies, drops (with the
reason, under the site's name), the site-policy fingerprints the accepted
replies declared and the policy rules under which they withheld metrics
(:func:`withheld_rules`, :mod:`strategies.rounds.withheld`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from logging import WARNING
from typing import Generic, Protocol, TypeVar

from flwr.app import ConfigRecord, Message
from flwr.supercore import log

from strategies.replies import InvalidReplyError, MetricsReply, TrainReply, site_name
from strategies.rounds.site_book import SiteBook
from strategies.rounds.withheld import NO_METRICS
from strategies.vertical.stage_answer import StageAnswer
from strategies.wire import message_keys as keys

__all__ = ["NO_REPLY", "Cap", "ReplyIntake", "ReplySink", "Taken", "policy_fingerprint",
           "reply_label", "withheld_rules"]

NO_REPLY = "no reply before the round closed (deadline or timeout)"
_ERROR_SITE = re.compile(r"site ([^\s:]+): ")

Reply = TypeVar("Reply", TrainReply, MetricsReply, StageAnswer)


class Cap(Enum):
    """Which of the site book's size caps a stage's ``num-examples`` is held to."""

    NONE = "none"
    TRAIN = "train"
    EVALUATE = "evaluate"


class ReplySink(Protocol[Reply]):
    """Where an accepted reply goes the moment it is taken (the train stage's update stream)."""

    def admit(self, reply: Reply) -> Reply | str:
        """The reply to keep, or the reason it is dropped."""


def reply_label(message: Message, node_id: int, book: SiteBook) -> str:
    """The name to record ``message`` (an answer for ``node_id``) under.

    Its node's bound name, else the one it declares: an error reply declares its
    site at the start of its reason (``site <name>: ``, :mod:`app.site_errors`).
    A declared name bound to another connected node is not used: such a reply is
    recorded under ``node-<id>`` (:meth:`SiteBook.label_reply`).
    """
    if message.has_content():
        return book.label_reply(node_id, site_name(message, node_id))
    declared = _ERROR_SITE.match(message.error.reason) if message.has_error() else None
    return book.label_reply(node_id, declared.group(1)) if declared else book.label(node_id)


def _site_text(message: Message, key: str) -> str:
    """The text under ``key`` in a reply's ``site`` record ("" if none)."""
    record = message.content.get(keys.SITE) if message.has_content() else None
    value = record.get(key) if isinstance(record, ConfigRecord) else None
    return value if isinstance(value, str) else ""


def policy_fingerprint(message: Message) -> str:
    """The site-policy fingerprint a reply declares in its ``site`` record ("" if none)."""
    return _site_text(message, keys.SITE_POLICY)


def withheld_rules(message: Message, reply: Reply) -> str:
    """The policy rules under which the accepted metrics ``reply`` withheld metrics ("" if none).

    The rules its ``site`` record names (``keys.WITHHELD``, comma-separated); a
    metrics reply with examples but only counts (``num-examples``, ``<split>-studies``)
    that names none: :data:`~strategies.rounds.withheld.NO_METRICS`.
    """
    if not isinstance(reply, MetricsReply):
        return ""
    rules = ",".join(r.strip() for r in _site_text(message, keys.WITHHELD).split(",")
                     if r.strip())
    counts_only = set(reply.metrics) <= {keys.NUM_EXAMPLES, keys.VAL_STUDIES, keys.TEST_STUDIES}
    return rules or (NO_METRICS if reply.num_examples > 0 and counts_only else "")


@dataclass
class Taken(Generic[Reply]):
    """What an exchange took in.

    Attributes
    ----------
    accepted : list
        The usable replies, in arrival order.
    dropped : dict[str, str]
        Site name -> why its reply was left out (or that it never came).
    policies : dict[str, str]
        Site name -> the site-policy fingerprint its accepted reply declared.
    withheld : dict[str, str]
        Site name -> the policy rules under which its accepted reply withheld metrics.
    labels : dict[int, str]
        Node -> the name its reply was recorded under.
    """

    accepted: list[Reply] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    policies: dict[str, str] = field(default_factory=dict)
    withheld: dict[str, str] = field(default_factory=dict)
    labels: dict[int, str] = field(default_factory=dict)


class ReplyIntake(Generic[Reply]):
    """Takes one exchange's replies (train, evaluate, query, cross-site or a vertical stage),
    once each.

    Parameters
    ----------
    stage : str
        Name used in the log lines (e.g. ``"aggregate_train"``).
    book : SiteBook
        The federation's site names and sizes (identity check, caps).
    parse : callable
        ``parse(message, node_id=...) -> reply``; raises :class:`InvalidReplyError`
        for an unusable reply.
    expected : dict[int, str]
        Each node sent an instruction -> its label (a node missing from the
        replies is recorded with :data:`NO_REPLY`).
    cap : Cap
        The size cap of the stage's ``num-examples`` (none for query and test replies).
    sink : ReplySink, optional
        Sees each accepted reply at once: the reply to keep, or why it is dropped
        (a refused reply still counts toward the quorum, as an identity refusal does).
    """

    def __init__(self, stage: str, book: SiteBook, parse: Callable[..., Reply],
                 expected: dict[int, str] | None = None, cap: Cap = Cap.NONE,
                 sink: ReplySink[Reply] | None = None) -> None:
        self.stage, self.book, self._parse = stage, book, parse
        self.expected = dict(expected or {})
        self.cap, self.sink = cap, sink
        self._taken: Taken[Reply] = Taken()

    def label(self, message: Message, node_id: int) -> str:
        """The name ``message`` is recorded under (:func:`reply_label`)."""
        return reply_label(message, node_id, self.book)

    def take(self, message: Message, node_id: int | None = None) -> tuple[str, bool]:
        """Parse, identity-check, cap and admit ``message``, the answer for ``node_id``.

        ``node_id`` defaults to the message's source (the SuperLink answers for a
        node that is gone under its own id: the exchange passes the node it sent
        the instruction to). Returns the label the reply is recorded under and
        whether it counts toward the quorum (it parsed).
        """
        node = message.metadata.src_node_id if node_id is None else node_id
        name = self.label(message, node)
        self._taken.labels.setdefault(node, name)
        try:
            reply = self._parse(message, node_id=node)
        except InvalidReplyError as exc:
            self._drop(name, str(exc))
            return name, False
        problem = self.book.identity_problem(node, reply.site)
        if problem is not None:
            self._drop(name, problem)
            return name, True
        if self.cap is not Cap.NONE:
            reply = self.book.capped_reply(reply, evaluate=self.cap is Cap.EVALUATE)
        kept = reply if self.sink is None else self.sink.admit(reply)
        if isinstance(kept, str):
            self._drop(name, kept)
            return name, True
        self._taken.accepted.append(kept)
        fingerprint, withheld = policy_fingerprint(message), withheld_rules(message, kept)
        if fingerprint:
            self._taken.policies[name] = fingerprint
        if withheld:
            self._taken.withheld[name] = withheld
        return name, True

    def take_all(self, messages: Iterable[Message]) -> Taken[Reply]:
        """Take ``messages`` (each from its own node) and :meth:`close`: a stage's replies
        handed over at once, as Flower's ``aggregate_train(replies)`` gets them."""
        for message in messages:
            self.take(message)
        return self.close()

    def _drop(self, name: str, reason: str) -> None:
        self._taken.dropped[name] = reason
        log(WARNING, "%s: dropped reply of %s: %s", self.stage, name, reason)

    def close(self) -> Taken[Reply]:
        """What was taken, with every expected node that never answered recorded as such.

        Evaluate replies are capped relative to the others' declarations here
        (:meth:`SiteBook.relatively_capped`), once every declaration is known.
        """
        taken, self._taken = self._taken, Taken()
        if self.cap is Cap.EVALUATE:
            taken.accepted = [self.book.relatively_capped(reply, evaluate=True)
                              for reply in taken.accepted]
        for node, name in self.expected.items():
            if node not in taken.labels:
                label = self.book.names.get(node, name)
                taken.dropped[label] = NO_REPLY
                log(WARNING, "%s: no reply from %s before the round closed", self.stage, label)
        return taken
