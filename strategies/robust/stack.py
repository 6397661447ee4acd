"""Check the ``(n, d)`` stack of updates every robust rule takes."""

from __future__ import annotations

import numpy as np

from strategies.wire.errors import ConfigError

__all__ = ["as_stack"]


def as_stack(updates: np.ndarray, rule: str) -> np.ndarray:
    """``updates`` as a finite float array of shape ``(n >= 1, d)``.

    Raises
    ------
    ConfigError
        The stack is not two-dimensional, has no row, or holds NaN/inf
        (replies are checked finite before aggregation, so this is a caller bug).
    """
    stack = np.asarray(updates)
    if stack.ndim != 2 or stack.shape[0] == 0:
        raise ConfigError(f"{rule}: updates must be an (n >= 1, d) array, got shape {stack.shape}")
    if not np.issubdtype(stack.dtype, np.floating):
        raise ConfigError(f"{rule}: updates must be floating point, got {stack.dtype}")
    if not np.isfinite(stack).all():
        raise ConfigError(f"{rule}: updates must be finite (check replies before aggregating)")
    return stack
