"""Taking in a round's replies: each validated (and its update decoded) exactly once.

Under a deadline and quorum (:mod:`.round_policy`) a reply must be validated as
it arrives, to know whether it counts toward the quorum; the same reply is then
aggregated. A :class:`ReplyIntake` keeps the outcome of the first validation of
each reply message -- the parsed value, or the :class:`InvalidReplyError` that
says why it is unusable -- and hands that same outcome to the aggregation, so a
train reply's update is unpacked and decoded once per round, not twice.

:meth:`ReplyIntake.accept` then records, under the site's name, why each
dropped reply was dropped and which selected sites never answered. A valid reply whose declared
site name is not the one bound to its node (or is bound to another connected
node) is dropped too (:meth:`SiteBook.identity_problem`). The site-policy
fingerprint each accepted reply declares is kept in :attr:`ReplyIntake.policies`.

An ``admit`` hook sees each valid reply right after its first validation, while
the round is still collecting: the train stage folds the update into the
running aggregate there and keeps the reply without it
(:mod:`strategies.rounds.update_stream`), so the decoded updates are not held
until the round closes. A hook that refuses a reply returns the reason, which
:meth:`ReplyIntake.accept` records like any other drop.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from logging import WARNING
from typing import Generic, TypeVar

from flwr.app import ConfigRecord, Message
from flwr.supercore import log

from strategies import message_keys as keys
from strategies.replies import InvalidReplyError, site_name
from strategies.rounds.site_book import SiteBook

__all__ = ["ReplyIntake", "NO_REPLY", "reply_label", "policy_fingerprint"]

NO_REPLY = "no reply before the round closed (deadline or timeout)"
_ERROR_SITE = re.compile(r"site ([^\s:]+): ")

Reply = TypeVar("Reply")


def reply_label(message: Message, book: SiteBook) -> str:
    """The name to record ``message`` under: its node's bound name, else the one it declares.

    An error reply declares its site at the start of its reason (``site <name>: ``,
    :mod:`app.site_errors`). A declared name bound to another connected node is not
    used: such a reply is recorded under ``node-<id>`` (:meth:`SiteBook.label_reply`).
    """
    node = message.metadata.src_node_id
    if message.has_content():
        return book.label_reply(node, site_name(message))
    declared = _ERROR_SITE.match(message.error.reason) if message.has_error() else None
    return book.label_reply(node, declared.group(1)) if declared else book.label(node)


def policy_fingerprint(message: Message) -> str:
    """The site-policy fingerprint a reply declares in its ``site`` record ("" if none)."""
    record = message.content.get(keys.SITE) if message.has_content() else None
    value = record.get(keys.SITE_POLICY) if isinstance(record, ConfigRecord) else None
    return value if isinstance(value, str) else ""


class ReplyIntake(Generic[Reply]):
    """Validates one stage's replies (train or evaluate) once each.

    Parameters
    ----------
    parse : callable
        ``parse(message) -> reply``; raises :class:`InvalidReplyError` for an
        unusable reply.
    stage : str
        Name used in the log lines (e.g. ``"aggregate_train"``).
    admit : callable, optional
        ``admit(message, reply) -> reply | reason``, called once per valid reply
        after its parse: the reply to keep, or why it is dropped (a refused reply
        still counts toward the quorum, as an identity refusal does).
    """

    def __init__(self, parse: Callable[[Message], Reply], stage: str,
                 admit: Callable[[Message, Reply], Reply | str] | None = None) -> None:
        self._parse = parse
        self._admit = admit
        self.stage = stage
        self.expected: dict[int, str] = {}
        self.policies: dict[str, str] = {}
        self._outcomes: dict[int, tuple[Message, Reply | InvalidReplyError | str]] = {}

    def expect(self, expected: dict[int, str]) -> None:
        """Start a round: ``expected`` maps each node sent a message to its label."""
        self.expected = dict(expected)
        self.policies = {}
        self._outcomes.clear()

    def outcome(self, message: Message) -> Reply | InvalidReplyError | str:
        """The parsed (and admitted) reply, or why it is unusable or refused; computed once."""
        seen = self._outcomes.get(id(message))
        if seen is not None and seen[0] is message:
            return seen[1]
        try:
            result: Reply | InvalidReplyError | str = self._parse(message)
        except InvalidReplyError as exc:
            result = exc
        else:
            if self._admit is not None:
                result = self._admit(message, result)
        self._outcomes[id(message)] = (message, result)
        return result

    def is_valid(self, message: Message) -> bool:
        """Whether ``message`` counts toward the quorum (the check aggregation makes)."""
        return not isinstance(self.outcome(message), InvalidReplyError)

    def accept(self, replies: Iterable[Message], dropped: dict[str, str],
               book: SiteBook) -> list[Reply]:
        """The usable replies; the others and the no-shows go to ``dropped`` with a reason.

        The site name of a valid reply is checked against (and, the first time,
        bound to) its node in ``book``. The kept outcomes are released
        afterwards (held replies carry decoded updates).
        """
        accepted: list[Reply] = []
        answered = set()
        for message in replies:
            node = message.metadata.src_node_id
            answered.add(node)
            name = reply_label(message, book)
            reply = self.outcome(message)
            reason = (str(reply) if isinstance(reply, (InvalidReplyError, str))
                      else book.identity_problem(node, reply.site))
            if reason is not None:
                dropped[name] = reason
                log(WARNING, "%s: dropped reply of %s: %s", self.stage, name, reason)
                continue
            accepted.append(reply)
            if policy_fingerprint(message):
                self.policies[name] = policy_fingerprint(message)
        for node, name in self.expected.items():
            if node not in answered:
                label = book.names.get(node, name)
                dropped[label] = NO_REPLY
                log(WARNING, "%s: no reply from %s before the round closed", self.stage, label)
        self._outcomes.clear()
        return accepted
