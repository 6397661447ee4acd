"""Aggregating a round so that no reply can end the run and no non-finite model is kept.

Every reply was validated on its own (:mod:`strategies.replies`), yet the
aggregator can still refuse the set (a weight out of range, a robust rule that
rejects an update): it raises a :class:`strategies.errors.ReplyError`. When the
error names the reply at fault (``index``, as
:class:`strategies.aggregation.AggregationError` does), that reply is dropped
with the reason and the others are aggregated again; otherwise the round keeps
the old model and records why. The new global model ``x - Delta`` is then
checked finite before it replaces the old one (and so before any checkpoint):
finite updates can still overflow, e.g. float32 updates near 3.4e38.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from logging import WARNING

import numpy as np
from flwr.supercore import log

from strategies.aggregation import AggregationError
from strategies.errors import ReplyError
from strategies.plugins.protocols import Aggregator
from strategies.replies import TrainReply

__all__ = ["AggregateOutcome", "aggregate_safely", "apply_update"]


@dataclass
class AggregateOutcome:
    """The aggregated update of a round, or why there is none.

    Attributes
    ----------
    delta : list of numpy.ndarray or None
        The update ``Delta`` to apply (``None`` when aggregation failed).
    info : dict[str, float]
        The aggregator's values to track (e.g. ``tau-eff``).
    used : list of TrainReply
        The replies aggregated (those the aggregator did not reject).
    failure : str
        Why the round keeps the old model; empty when ``delta`` is usable.
    """

    delta: list[np.ndarray] | None
    info: dict[str, float] = field(default_factory=dict)
    used: list[TrainReply] = field(default_factory=list)
    failure: str = ""


def aggregate_safely(aggregator: Aggregator, replies: list[TrainReply],
                     dropped: dict[str, str]) -> AggregateOutcome:
    """``aggregator.aggregate(replies)``, dropping each reply it names as at fault.

    A :class:`ReplyError` with an ``index`` drops ``replies[index]`` into
    ``dropped`` (by site name) and retries with the rest; one without is
    returned as the round's failure, as is a round whose every reply was dropped.
    """
    used = list(replies)
    while used:
        try:
            delta, info = aggregator.aggregate(used)
        except ReplyError as exc:
            index = exc.index if isinstance(exc, AggregationError) else None
            if index is None or not 0 <= index < len(used):
                return AggregateOutcome(None, used=used,
                                        failure=f"aggregation failed: {exc}")
            culprit = used.pop(index)
            dropped[culprit.site] = f"rejected by the aggregation: {exc}"
            log(WARNING, "aggregate_train: dropped reply of %s: %s", culprit.site, exc)
            continue
        return AggregateOutcome(list(delta), dict(info), used)
    return AggregateOutcome(None, failure="aggregation failed: it rejected every reply")


def apply_update(global_arrays: list[np.ndarray], delta: list[np.ndarray],
                 keys: list[str]) -> tuple[list[np.ndarray] | None, str]:
    """The new global arrays ``x - Delta`` in ``x``'s dtypes, or ``None`` and why not.

    ``None`` when an entry is NaN or infinite (the reason names the array's
    key): the caller keeps the old model.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        updated = [np.asarray(g - d).astype(g.dtype, copy=False)
                   for g, d in zip(global_arrays, delta)]
    for key, array in zip(keys, updated):
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            return None, (f"aggregation failed: new global array '{key}' is not finite; "
                          "the previous model is kept")
    return updated, ""
