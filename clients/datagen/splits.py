"""The splits of a synthetic hospital: argument checks, a stratified validation set, counts.

Each generator puts a share of its items into ``val`` (stratified by class where it
has classes), the rest into ``train``, then appends ``num_test`` held-out items as
``test`` (:mod:`clients.cxr_cls.synthetic`, :mod:`clients.ct3d_cls.synthetic`,
:mod:`clients.pe_seg.synthetic`). By default every demo site's ``val`` and ``test``
splits hold at least :data:`MIN_EVAL_ITEMS` items, so the shipped site policy
releases their metrics.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

__all__ = ["MIN_EVAL_ITEMS", "check_split_arguments", "stratified_val", "split_counts"]

#: The shipped site policy's ``min-val-items`` (configs/site-policy.toml): a split evaluated
#: over fewer items releases only its counts, so the demo writes at least this many.
MIN_EVAL_ITEMS = 2


def check_split_arguments(val_fraction: float, num_test: int, *, val_required: bool = False) -> None:
    """Refuse a ``val_fraction`` outside ``[0, 1)`` (``(0, 1)`` if ``val_required``) or ``num_test < 0``.

    Raises
    ------
    ValueError
        Naming the argument and its value.
    """
    if val_required and not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if num_test < 0:
        raise ValueError(f"num_test must be >= 0, got {num_test}")


def stratified_val(rng: np.random.Generator, labels: np.ndarray, val_fraction: float) -> set[int]:
    """Indices of a validation split with ``val_fraction`` of each class of 0/1 ``labels``.

    Each class with ``m >= 2`` members gives ``min(max(1, round(val_fraction * m)), m - 1)``
    of them, drawn by ``rng`` (class 0 first), so both splits keep both classes.
    """
    labels = np.asarray(labels)
    val: set[int] = set()
    for value in (0, 1):
        members = np.flatnonzero(labels == value)
        if len(members) < 2:
            continue
        count = min(max(1, round(val_fraction * len(members))), len(members) - 1)
        val.update(rng.permutation(members)[:count].tolist())
    return val


def split_counts(splits: Iterable[str]) -> str:
    """``"(<a> train, <b> val, <c> test)"``: how many items each split holds."""
    splits = list(splits)
    train, val, test = (splits.count(name) for name in ("train", "val", "test"))
    return f"({train} train, {val} val, {test} test)"
