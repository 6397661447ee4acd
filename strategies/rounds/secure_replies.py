"""The replies of a SecAgg+ round's stages, validated once as every reply is.

A stage reply (setup, share-keys, unmask) carries its protocol entries in the
ConfigRecord ``secagg`` (:data:`strategies.wire.message_keys.SECAGG`) next to the
``site`` record (and, at setup, the ``metrics`` record with ``num-examples``): it
becomes a :class:`StageReply`, whose entries the round's
:class:`~strategies.secure_aggregation.coordinator.SecAggRound` then takes.

A collect reply carries the site's masked vector as the single uint8 array
``secagg-masked`` of the ``delta`` record and the train metrics in the clear: it
becomes a :class:`~strategies.rounds.reply_intake.TrainReply` whose ``delta`` is that one
array until it is added into the round's running sum (then it is emptied: the
coordinator never keeps one site's masked vector). Metrics that would reveal a
site's update (:data:`REVEALING`: the error-feedback residual's norm) are left
out of the reply, so they are never recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message

from strategies.wire import message_keys as keys
from strategies.wire.local_solver import LocalSolver
from strategies.rounds.reply_intake import (InvalidReplyError, TrainReply, checked_steps,
                                parse_metrics_reply, site_name, wire_size)

__all__ = ["REVEALING", "StageReply", "parse_masked_reply", "parse_stage_reply"]

#: Metrics a site's update could be read from: never kept from a secure round's reply.
REVEALING = (keys.RESIDUAL_NORM,)


@dataclass(frozen=True)
class StageReply:
    """A validated setup, share-keys or unmask reply: the site and its protocol entries."""

    node_id: int
    site: str
    num_examples: int = 0
    entries: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    wire_bytes: int = 0


def parse_stage_reply(message: Message, *, node_id: int, sized: bool = False) -> StageReply:
    """``node_id``'s reply to a setup (``sized``: with ``num-examples``), share-keys or
    unmask instruction.

    Raises
    ------
    InvalidReplyError
        For an error reply, a missing ``secagg`` record or (``sized``) missing metrics.
    """
    if message.has_error():
        raise InvalidReplyError(f"site reported an error: {message.error.reason}")
    record = message.content.get(keys.SECAGG)
    if not isinstance(record, ConfigRecord):
        raise InvalidReplyError(f"missing ConfigRecord '{keys.SECAGG}'")
    clear = parse_metrics_reply(message, keys.EVALUATE_REQUIRED, node_id=node_id) if sized else None
    if clear is not None and clear.num_examples < 1:
        raise InvalidReplyError(f"'{keys.NUM_EXAMPLES}' must be a positive integer, got 0")
    return StageReply(node_id=node_id, site=site_name(message, node_id),
                      num_examples=clear.num_examples if clear else 0, entries=dict(record),
                      metrics=clear.metrics if clear else {}, wire_bytes=wire_size(message.content))


def _masked(message: Message) -> np.ndarray:
    """The reply's one masked vector (uint8, 1-D) from its ``delta`` record."""
    record = message.content.get(keys.DELTA)
    if not isinstance(record, ArrayRecord) or list(record.keys()) != [keys.SECAGG_MASKED]:
        raise InvalidReplyError(f"'{keys.DELTA}' must hold the single array "
                                f"'{keys.SECAGG_MASKED}'")
    try:
        masked = record[keys.SECAGG_MASKED].numpy()
    except Exception as exc:  # noqa: BLE001 - any decoding failure makes the reply unusable
        raise InvalidReplyError(f"'{keys.SECAGG_MASKED}' cannot be decoded: {exc}") from exc
    if masked.dtype != np.uint8 or masked.ndim != 1:
        raise InvalidReplyError(f"'{keys.SECAGG_MASKED}' must be a 1-D uint8 array, got "
                                f"{masked.dtype} of shape {masked.shape}")
    return masked


def parse_masked_reply(message: Message, *, node_id: int, tau: int,
                       solver: LocalSolver) -> TrainReply:
    """``node_id``'s collect reply: train metrics (``steps`` in ``1 .. tau``, the a-norm by
    ``solver``, :data:`REVEALING` left out) and its masked vector as the reply's ``delta``.

    Raises
    ------
    InvalidReplyError
        With the reason the reply is unusable.
    """
    clear = parse_metrics_reply(message, keys.TRAIN_REQUIRED, node_id=node_id)
    steps = checked_steps(clear.metrics[keys.STEPS], tau)
    a_norm = solver.a_norm(steps)
    metrics = {name: value for name, value in clear.metrics.items() if name not in REVEALING}
    metrics[keys.A_NORM] = a_norm
    return TrainReply(node_id=node_id, site=clear.site, delta=[_masked(message)],
                      num_examples=clear.num_examples, steps=steps,
                      train_loss=metrics[keys.TRAIN_LOSS], metrics=metrics,
                      wire_bytes=clear.wire_bytes, a_norm=a_norm, tau_a_norm=solver.a_norm(tau))
