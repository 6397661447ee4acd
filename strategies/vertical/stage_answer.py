"""One site's answer to a vertical stage (``train.vertical``), parsed once at the reply intake.

A vertical stage's reply carries a ``vertical`` ArrayRecord (the stage's named arrays: PSI
curve points, an ID encoder's weights, cut-layer activations or gradients), a ``metrics``
MetricRecord and a ``site`` ConfigRecord (the department, the task). :func:`parse_stage_answer`
is the :class:`~strategies.rounds.reply_intake.ReplyIntake`'s parse for them: a record of
another kind, an array that cannot be read, is not numeric or not finite, or a metric that
is no finite number makes the reply unusable, with the reason (:class:`InvalidReplyError`),
before any flow reads it. What each stage needs of the arrays (their names and shapes) the
flow checks (:mod:`app.vertical.psi_flow`, :mod:`app.vertical.pvfed_flow`,
:mod:`app.vertical.split_flow`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord

from strategies.rounds.reply_intake import InvalidReplyError, site_name
from strategies.wire import message_keys as keys

__all__ = ["StageAnswer", "parse_stage_answer"]

#: Array kinds a stage may carry: bool, signed and unsigned integers, floats.
_NUMERIC = "biuf"


@dataclass(frozen=True)
class StageAnswer:
    """One site's usable reply to a stage."""

    node_id: int
    arrays: dict[str, np.ndarray]
    metrics: dict[str, float | int]
    info: dict[str, str]
    #: The name the reply declares (``node-<id>`` when none): the site book's identity check.
    site: str = ""


def _record(message: Message, key: str, kind: type):
    """The reply's record ``key`` if it is a ``kind`` (None when absent)."""
    record = message.content.get(key)
    if record is not None and not isinstance(record, kind):
        raise InvalidReplyError(f"'{key}' is {type(record).__name__}, not {kind.__name__}")
    return record


def _arrays(record: ArrayRecord | None) -> dict[str, np.ndarray]:
    arrays = {}
    for name, array in (record or {}).items():
        try:
            value = array.numpy()
        except (AttributeError, TypeError, ValueError) as exc:
            raise InvalidReplyError(f"array {name!r} of '{keys.VERTICAL}' cannot be read "
                                    f"({exc})") from exc
        if value.dtype.kind not in _NUMERIC:
            raise InvalidReplyError(f"array {name!r} is of dtype {value.dtype}, not numbers")
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            raise InvalidReplyError(f"array {name!r} is not finite")
        arrays[name] = value
    return arrays


def _metrics(record: MetricRecord | None) -> dict[str, float | int]:
    metrics: dict[str, float | int] = {}
    for name, value in (record or {}).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidReplyError(f"metric {name!r} is not a number ({value!r})")
        if not math.isfinite(value):
            raise InvalidReplyError(f"metric {name!r} is not finite ({value})")
        metrics[name] = value
    return metrics


def parse_stage_answer(message: Message, node_id: int | None = None) -> StageAnswer:
    """The :class:`StageAnswer` of a stage's reply (the answer for ``node_id``, default its
    source).

    Raises
    ------
    InvalidReplyError
        For an error reply (its reason: a policy refusal names the rule) and for a record,
        array or metric that is unusable (see the module docstring).
    """
    node = message.metadata.src_node_id if node_id is None else node_id
    if message.has_error():
        raise InvalidReplyError(f"site reported an error: {message.error.reason}")
    arrays = _arrays(_record(message, keys.VERTICAL, ArrayRecord))
    metrics = _metrics(_record(message, keys.METRICS, MetricRecord))
    site = _record(message, keys.SITE, ConfigRecord) or {}
    return StageAnswer(node, arrays, metrics, {k: str(v) for k, v in site.items()},
                       site_name(message, node))
