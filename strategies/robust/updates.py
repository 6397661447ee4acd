"""The robust rules on model updates: lists of arrays in the model's parameter order.

A site's update ``Delta_k`` is a list of numpy arrays. Multi-Krum (and the
norm bound, :mod:`.norm_bound`) measure only its **floating-point** arrays: an integer buffer (such
as BatchNorm's ``num_batches_tracked``, whose update is minus the local step
count) carries no learnt signal and would dominate an L2 norm or a distance.
The coordinate-wise rules (trimmed mean, median) are applied to every array,
integers included (rounded back half-to-even, as the weighted mean does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from strategies.wire.errors import ConfigError

__all__ = ["coordinatewise", "float_stack"]

Update = Sequence[np.ndarray]


def _is_float(array: np.ndarray) -> bool:
    return np.issubdtype(array.dtype, np.floating)


def float_stack(updates: Sequence[Update]) -> np.ndarray:
    """The ``(n, d)`` float64 stack of the updates' floating-point arrays, one row per update.

    Raises
    ------
    ConfigError
        If the updates differ in their float arrays' count or sizes (replies are
        checked against the global model first, so this is a caller bug).
    """
    rows = [np.concatenate([a.ravel() for a in u if _is_float(a)] or [np.zeros(0)],
                           dtype=np.float64) for u in updates]
    if len({row.size for row in rows}) > 1:
        raise ConfigError(f"robust rules: updates of different sizes {[r.size for r in rows]}")
    return np.stack(rows) if rows else np.zeros((0, 0))


def coordinatewise(updates: Sequence[Update],
                   rule: Callable[[np.ndarray], np.ndarray]) -> list[np.ndarray]:
    """Apply a coordinate-wise ``rule`` (``(n, d)`` -> ``(d,)``) to every array position.

    Each position ``j`` is stacked over the updates in float64, reduced by
    ``rule`` and cast back to the array's dtype (integers rounded half-to-even
    and clipped to their range).

    Raises
    ------
    ConfigError
        For no update, or updates whose arrays differ in count or shape.
    """
    if not updates:
        raise ConfigError("robust rules: no update to aggregate")
    first = updates[0]
    if any(len(u) != len(first) for u in updates):
        raise ConfigError("robust rules: updates hold different numbers of arrays")
    result: list[np.ndarray] = []
    for j, ref in enumerate(first):
        if any(u[j].shape != ref.shape for u in updates):
            raise ConfigError(f"robust rules: array {j} differs in shape between updates")
        stack = np.stack([u[j].ravel() for u in updates]).astype(np.float64)
        value = rule(stack).reshape(ref.shape)
        if _is_float(ref):
            result.append(value.astype(ref.dtype))
        else:
            info = np.iinfo(ref.dtype)
            result.append(np.clip(np.rint(value), info.min, info.max).astype(ref.dtype))
    return result
