"""A site's reply at the server: parsed, checked and taken in exactly once.

A site chooses its reply (update, sizes, steps, metrics, names), and Flower's own
strategies raise on replies with inconsistent keys, which ends the whole federation
because of one bad site. Here every reply is taken on its own and becomes a typed
value (:class:`TrainReply`, :class:`MetricsReply`, a vertical stage's ``StageAnswer``)
or a drop with the reason (:class:`InvalidReplyError`); a malformed reply never
crashes a round.

**Checks** (:func:`parse_train_reply`, :func:`parse_metrics_reply`): records present,
required metrics finite and each metric within its range, update arrays matching the
global model's count, shapes and dtypes, all entries finite, ``steps`` within the tau
sent (FedNova's a-norm computed here, on the server).

**Metric ranges** (:data:`DECLARED`, ONE table read at both ends). One site reporting
``val-auc = 1e6`` next to 0.70 and 0.72 made the federation's example-weighted AUC
333,333.8 and picked the round registered as the best model (issue #29); a metric is
also a channel out of the hospital: a name or a value the product never sends can
carry anything (issue #44). :data:`DECLARED` is therefore the one list of the metric
names the product's sites send, each with its range. The server drops a reply whose
metric is out of its range (:func:`range_problem`) and still accepts a name the table
does not declare (it only has to be finite); the hospital's site runtime
(:mod:`app.site_runtime.egress_filter`) refuses a reply that carries an undeclared
name (:func:`declared`) or a value out of range. The names
(:mod:`strategies.wire.message_keys`, :mod:`clients.site.site_round`'s
``<split>-<name>``, personalisation's ``personalised-<split>-<name>``, the vertical
stages' own, the tasks' ``main_metric`` and metrics, :data:`TASK_METRICS`):

* rates in [0, 1] -- ``<split>-<metric>`` for the tasks' metrics (``val-dice``,
  ``test-auc``), after ``personalised-``, ``local-`` or ``pvfed-``;
* losses >= 0 -- ``train-loss``, ``initial-loss``, ``query-loss``, ``encoder-loss``,
  ``[personalised-]<split>-loss``;
* counts, whole numbers >= 0 -- ``num-examples``, ``steps``, ``studies-skipped``,
  ``<split>-studies``, ``<split>-examples``, ``psi-size``, ``patients``,
  ``feature-width``, ``head-inputs`` and the acknowledged versions
  ``downlink-version``, ``pruning-version``;
* durations and norms >= 0 -- ``train-seconds``, ``residual-norm``;
* privacy -- ``epsilon`` and ``epsilon-left`` >= 0, ``epsilon-round`` finite (an
  increase, which concurrent computations settling meanwhile can make slightly
  negative).

**Wire size** (:func:`wire_size`): the bytes Flower really puts on the wire. Flower
1.4x sends a message as a tree of content-addressed objects (RecordDict ->
ArrayRecord -> Array, ...), each serialised by its ``deflate()``; the size of a
message's content is the sum over that tree. The byte accounting of a round
(:mod:`strategies.rounds.round_metrics`) measures the instructions the same way.

**Intake** (:class:`ReplyIntake`). Under a deadline and quorum (:mod:`.round_policy`)
a reply must be validated as it arrives, to know whether it counts toward the
quorum; the same outcome is then aggregated. :meth:`ReplyIntake.take` takes each
reply message once, for the node the instruction was sent to:

1. its *label*, the name it is recorded under (:func:`reply_label`);
2. its parse into a typed value, or the :class:`InvalidReplyError` that says why it
   is unusable;
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

import math
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from enum import Enum
from logging import WARNING
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.supercore import log
from flwr.supercore.inflatable.inflatable_object import InflatableObject

from strategies.rounds.withheld import NO_METRICS
from strategies.wire import message_keys as keys
from strategies.wire.codecs.identity import SPEC as DENSE
from strategies.wire.errors import ReplyError
from strategies.wire.local_solver import LocalSolver
from strategies.wire.update_codec import unpack_update
from strategies.wire.model_layout import UpdateFormatError, dense_update

if TYPE_CHECKING:  # both import this module
    from strategies.rounds.site_book import SiteBook
    from strategies.vertical.stage_answer import StageAnswer

__all__ = [
    "DECLARED", "MetricRange", "SPLITS", "TASK_METRICS", "declared", "range_problem",
    "InvalidReplyError", "TrainReply", "checked_steps", "MetricsReply", "site_name",
    "parse_train_reply", "parse_metrics_reply", "wire_size",
    "NO_REPLY", "Cap", "ReplyIntake", "ReplySink", "Taken", "policy_fingerprint",
    "reply_label", "withheld_rules",
]


@dataclass(frozen=True)
class MetricRange:
    """The interval ``[low, high]`` a metric's finite value must lie in, and its rule in words.

    ``whole``: the value must also be a whole number (a count).
    """

    low: float
    high: float
    rule: str
    whole: bool = False

    def holds(self, value: float) -> bool:
        """Whether ``value`` is finite, lies in ``[low, high]`` and is whole when it must be."""
        return (math.isfinite(value) and self.low <= value <= self.high
                and (not self.whole or value == int(value)))


#: The evaluation splits a metric name starts with (``val-dice``, ``test-auc``).
SPLITS = keys.EVAL_SPLITS
#: The tasks' evaluation metrics (their ``main_metric`` and ``EvalResult.metrics`` names:
#: Dice for pe-seg, ROC AUC and accuracy for the classifiers); all rates.
TASK_METRICS = ("auc", "dice", "accuracy")

_SPLIT = "|".join(SPLITS)
_RATES = "|".join(TASK_METRICS)
_COUNTS = (keys.NUM_EXAMPLES, keys.STEPS, keys.STUDIES_SKIPPED, "psi-size", "patients",
           "feature-width", "head-inputs", keys.DOWNLINK_VERSION, keys.PRUNING_VERSION)
_LOSSES = (keys.TRAIN_LOSS, keys.INITIAL_LOSS, keys.QUERY_LOSS, "encoder-loss")


def _names(names: tuple[str, ...]) -> str:
    return "|".join(re.escape(name) for name in names)


#: Metric-name pattern (a full match) -> its range; a name matches at most one pattern.
DECLARED: tuple[tuple[re.Pattern[str], MetricRange], ...] = (
    (re.compile(rf"(?:(?:personalised|local|pvfed)-)?(?:{_SPLIT})-(?:{_RATES})"),
     MetricRange(0.0, 1.0, "AUC, Dice and accuracy are rates in [0, 1]")),
    (re.compile(rf"{_names(_LOSSES)}|(?:personalised-)?(?:{_SPLIT})-loss"),
     MetricRange(0.0, math.inf, "losses are finite and >= 0")),
    (re.compile(rf"{_names(_COUNTS)}|(?:{_SPLIT})-(?:studies|examples)"),
     MetricRange(0.0, math.inf, "counts are >= 0 and whole numbers", whole=True)),
    (re.compile(_names((keys.TRAIN_SECONDS, keys.RESIDUAL_NORM))),
     MetricRange(0.0, math.inf, "durations and norms are >= 0")),
    (re.compile(_names((keys.EPSILON, keys.EPSILON_LEFT))),
     MetricRange(0.0, math.inf, "a privacy budget's epsilon is >= 0")),
    (re.compile(re.escape(keys.EPSILON_ROUND)),
     MetricRange(-math.inf, math.inf, "a computation's epsilon increase is finite")),
)


def declared(name: str) -> MetricRange | None:
    """The range of the declared metric ``name``; ``None`` when the product sends no such name."""
    for pattern, allowed in DECLARED:
        if pattern.fullmatch(name):
            return allowed
    return None


def range_problem(name: str, value: float) -> str | None:
    """Why ``value`` is out of range for the metric ``name`` (``None``: it is in range,
    or the table declares no such name), naming the metric, the value and the rule."""
    allowed = declared(name)
    if allowed is None or allowed.holds(value):
        return None
    return f"metric '{name}' = {value:g} is out of range: {allowed.rule}"


def wire_size(obj: InflatableObject) -> int:
    """Serialised size in bytes of ``obj`` and all the objects it references."""
    children = obj.children or {}
    return len(obj.deflate()) + sum(wire_size(child) for child in children.values())


class InvalidReplyError(ReplyError):
    """A site's reply cannot be used; the message gives the reason."""


@dataclass(frozen=True)
class TrainReply:
    """A validated train reply."""

    node_id: int
    site: str
    delta: list[np.ndarray]
    num_examples: int
    steps: int
    train_loss: float
    metrics: dict[str, float] = field(default_factory=dict)
    wire_bytes: int = 0
    a_norm: float = 0.0
    #: ``||a||_1`` of the tau the site was sent (a full round; 0 when unknown), by the server.
    tau_a_norm: float = 0.0
    #: The encoded side payloads of ``delta`` by key, each a channel the round's features
    #: declared (:attr:`strategies.rounds.round_feature.RoundFeature.channels`, which decode
    #: them); a channel not sent is absent.
    channels: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class MetricsReply:
    """A validated evaluate or query reply (metrics only)."""

    node_id: int
    site: str
    num_examples: int
    metrics: dict[str, float] = field(default_factory=dict)
    wire_bytes: int = 0


def site_name(message: Message, node_id: int | None = None) -> str:
    """The site name a reply declares, or ``node-<id>`` when it declares none.

    ``node_id`` is the node the reply answers for (default: its source).
    """
    fallback = f"node-{message.metadata.src_node_id if node_id is None else node_id}"
    if not message.has_content():
        return fallback
    record = message.content.get(keys.SITE)
    if isinstance(record, ConfigRecord) and isinstance(record.get(keys.SITE_NAME), str):
        return str(record[keys.SITE_NAME]) or fallback
    return fallback


def _metrics(message: Message, required: tuple[str, ...],
             allow_none: bool = False) -> dict[str, float]:
    """The reply's finite metrics, each within its range (:func:`range_problem`);
    ``num-examples`` a positive integer (or 0 if ``allow_none``)."""
    if message.has_error():
        raise InvalidReplyError(f"site reported an error: {message.error.reason}")
    record = message.content.get(keys.METRICS)
    if not isinstance(record, MetricRecord):
        raise InvalidReplyError(f"missing MetricRecord '{keys.METRICS}'")
    missing = [k for k in required if k not in record]
    if missing:
        raise InvalidReplyError(f"missing metrics {missing}")
    values: dict[str, float] = {}
    for name, value in record.items():
        if isinstance(value, list):
            continue
        if not math.isfinite(float(value)):
            raise InvalidReplyError(f"metric '{name}' is not finite ({value})")
        problem = range_problem(name, float(value))
        if problem is not None:
            raise InvalidReplyError(problem)
        values[name] = float(value)
    count = values[keys.NUM_EXAMPLES]
    if count < (0 if allow_none else 1) or count != int(count):
        raise InvalidReplyError(f"'{keys.NUM_EXAMPLES}' must be a "
                                f"{'non-negative' if allow_none else 'positive'} integer, "
                                f"got {count}")
    return values


def _delta(message: Message, reference: list[np.ndarray], codec: str, seed: int,
           channels: Collection[str]) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """The decoded update and, by key, the encoded side payloads the reply carries of the
    ``channels`` asked for (any other is refused, naming it).

    A dense update (``codec`` ``none``) is read straight from its payload
    (:func:`~strategies.wire.model_layout.dense_update`); any other, or one it cannot read, is
    decoded by its codec, whose checks give the reason."""
    record = message.content.get(keys.DELTA)
    if not isinstance(record, ArrayRecord):
        raise InvalidReplyError(f"missing ArrayRecord '{keys.DELTA}'")
    try:
        arrays = {name: array.numpy() for name, array in record.items()}
    except Exception as exc:  # noqa: BLE001 - any decoding failure makes the reply unusable
        raise InvalidReplyError(f"'{keys.DELTA}' cannot be decoded: {exc}") from exc
    side = {key: arrays.pop(key) for key in channels if key in arrays}
    for key, payload in side.items():
        if payload.dtype != np.uint8:
            raise InvalidReplyError(f"'{key}' must be a uint8 payload, got {payload.dtype}")
    try:
        delta = dense_update(arrays, reference) if codec == DENSE else None
        if delta is None:
            delta = unpack_update(arrays, reference, codec, seed)
    except UpdateFormatError as exc:
        raise InvalidReplyError(str(exc)) from exc
    for i, array in enumerate(delta):
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            raise InvalidReplyError(f"array {i}: contains NaN or infinite values")
    return delta, side


def checked_steps(steps: float, max_steps: int | None) -> int:
    """A train reply's reported ``steps``: an integer in ``1 .. max_steps`` (the tau the site
    was sent; no upper bound when ``None``), else :class:`InvalidReplyError`."""
    if steps < 1 or steps != int(steps) or (max_steps is not None and steps > max_steps):
        bound = "" if max_steps is None else f" <= {max_steps} (the tau sent)"
        raise InvalidReplyError(
            f"'{keys.STEPS}' must be a positive integer{bound}, got {steps}")
    return int(steps)


def parse_train_reply(message: Message, reference: list[np.ndarray], codec: str = "none",
                      seed: int = 0, max_steps: int | None = None,
                      solver: LocalSolver | None = None, *,
                      node_id: int | None = None, channels: Collection[str] = ()) -> TrainReply:
    """Validate a train reply against the global model ``reference`` and decode its update.

    ``codec`` and ``seed`` are the update codec spec and the codec seed this
    site was given for the round (:mod:`strategies.wire.update_codec`); ``node_id``
    the node the reply answers for (default: its source). The
    reported ``steps`` must be an integer in ``1 .. max_steps`` (the tau the
    site was sent; no upper bound when ``None``). FedNova's a-norm is computed
    here from those steps with ``solver`` (default :class:`LocalSolver`, plain
    steps); an ``a-norm`` the site sends is replaced by the server's value. ``channels``
    are the keys of the side payloads the round's features take
    (:attr:`TrainReply.channels`); a reply with another side payload is refused.

    Raises
    ------
    InvalidReplyError
        With the reason the reply is unusable.
    """
    metrics = _metrics(message, keys.TRAIN_REQUIRED)
    steps = checked_steps(metrics[keys.STEPS], max_steps)
    a_norm = (solver or LocalSolver()).a_norm(steps)
    metrics[keys.A_NORM] = a_norm
    node_id = message.metadata.src_node_id if node_id is None else node_id
    delta, side = _delta(message, reference, codec, seed, channels)
    return TrainReply(
        node_id=node_id,
        site=site_name(message, node_id),
        delta=delta,
        channels=side,
        wire_bytes=wire_size(message.content),
        num_examples=int(metrics[keys.NUM_EXAMPLES]),
        steps=int(steps),
        train_loss=metrics[keys.TRAIN_LOSS],
        metrics=metrics,
        a_norm=a_norm,
    )


def parse_metrics_reply(message: Message,
                        required: tuple[str, ...] = keys.EVALUATE_REQUIRED, *,
                        node_id: int | None = None) -> MetricsReply:
    """Validate a reply that carries only metrics: evaluate (default) or query.

    ``required`` names the metrics that must be present: ``keys.EVALUATE_REQUIRED``
    for an evaluate reply, ``keys.QUERY_REQUIRED`` for a query reply (the global
    model's loss at a candidate site). An evaluate reply may count 0 examples (a
    site without items in the evaluated split, e.g. a site of test data only,
    replies the counts alone); a query reply may not. ``node_id`` is the node the
    reply answers for (default: its source).

    Raises
    ------
    InvalidReplyError
        With the reason the reply is unusable.
    """
    metrics = _metrics(message, required, allow_none=required == keys.EVALUATE_REQUIRED)
    node_id = message.metadata.src_node_id if node_id is None else node_id
    return MetricsReply(
        node_id=node_id,
        site=site_name(message, node_id),
        num_examples=int(metrics[keys.NUM_EXAMPLES]),
        metrics=metrics,
        wire_bytes=wire_size(message.content),
    )


NO_REPLY = "no reply before the round closed (deadline or timeout)"
_ERROR_SITE = re.compile(r"site ([^\s:]+): ")

#: A reply the intake takes; ``StageAnswer`` by name (its module imports this one).
Reply = TypeVar("Reply", TrainReply, MetricsReply, "StageAnswer")


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
    named = _ERROR_SITE.match(message.error.reason) if message.has_error() else None
    return book.label_reply(node_id, named.group(1)) if named else book.label(node_id)


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
