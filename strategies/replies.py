"""Validation of site replies: a malformed reply is dropped, never crashes a round.

Flower's own strategies raise on replies with inconsistent keys, which ends the
whole federation because of one bad site. Here every reply is checked on its
own (records present, required metrics finite and each metric within its range,
:mod:`strategies.metric_ranges`, update arrays matching the
global model's count, shapes and dtypes, all entries finite) and turned into a
typed value, or into an :class:`InvalidReplyError` whose message says why.

A reply's size is the bytes Flower really puts on the wire (:func:`wire_size`):
Flower 1.4x sends a message as a tree of content-addressed objects (RecordDict
-> ArrayRecord -> Array, ...), each serialised by its ``deflate()``; the size of
a message's content is the sum over that tree. The byte accounting of a round
(:mod:`strategies.rounds.traffic`) measures the instructions the same way.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.supercore.inflatable.inflatable_object import InflatableObject

from strategies.metric_ranges import range_problem
from strategies.wire import message_keys as keys
from strategies.wire.codecs.identity import SPEC as DENSE
from strategies.wire.errors import ReplyError
from strategies.wire.local_solver import LocalSolver
from strategies.wire.update_codec import unpack_update
from strategies.wire.update_layout import UpdateFormatError, dense_update

__all__ = [
    "InvalidReplyError",
    "TrainReply",
    "checked_steps",
    "MetricsReply",
    "site_name",
    "parse_train_reply",
    "parse_metrics_reply",
    "wire_size",
]


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
    (:func:`~strategies.wire.update_layout.dense_update`); any other, or one it cannot read, is
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
