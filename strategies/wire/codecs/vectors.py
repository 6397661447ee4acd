"""The flat update vector: model parameter order <-> one float32 vector."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from strategies.wire.codecs.errors import CodecError

__all__ = ["flatten", "unflatten"]


def flatten(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Concatenate arrays (model parameter order) into one float32 vector.

    Integer arrays (e.g. BatchNorm ``num_batches_tracked``) are converted to
    float32, exact up to ``2**24``.

    Raises
    ------
    CodecError
        If an item is not a numeric (float or integer) numpy array.
    """
    parts = []
    for i, array in enumerate(arrays):
        if not isinstance(array, np.ndarray) or array.dtype.kind not in "fiu":
            raise CodecError(
                f"flatten: item {i} must be a float or integer numpy array, got "
                f"{getattr(array, 'dtype', type(array).__name__)}"
            )
        parts.append(array.ravel())
    if not parts:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate(parts, dtype=np.float32, casting="unsafe")


def unflatten(vec: np.ndarray, like: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Split a flat vector back into arrays shaped and typed like ``like``.

    Integer targets are rounded half-to-even and clipped to their range.

    Raises
    ------
    CodecError
        If ``vec`` is not 1-D or its length differs from the total size of ``like``.
    """
    vec = np.asarray(vec)
    total = sum(int(np.prod(a.shape)) for a in like)
    if vec.ndim != 1 or vec.size != total:
        raise CodecError(
            f"unflatten: vector of shape {vec.shape} does not match the {total} "
            f"entries of the {len(like)} target arrays"
        )
    out: list[np.ndarray] = []
    offset = 0
    for array in like:
        n = int(np.prod(array.shape))
        chunk = vec[offset : offset + n].reshape(array.shape)
        offset += n
        if array.dtype.kind in "iu":
            info = np.iinfo(array.dtype)
            out.append(np.clip(np.rint(chunk), info.min, info.max).astype(array.dtype))
        else:
            out.append(chunk.astype(array.dtype))
    return out

