"""The vector a site masks: its update's float arrays, all of them or rand-k's shared coordinates.

Integer buffers (BatchNorm's ``num_batches_tracked``) are not masked: a counter is
not an average, and the coordinator advances it from the reported steps.

Compression composes with secure aggregation only where the codec is linear across
sites: every site must send the same coordinates, so that the masked vectors add up
coordinate by coordinate. ``randk:<f>`` does when its seed is the round's, shared by
all sites (:func:`shared_codec_seed`), not the per-site seed of a plain round;
``fp16`` is replaced by the ``b``-bit quantisation. ``topk`` (per-site indices),
``qsgd`` and ``sign`` (per-site scales) cannot be summed masked. Normalisation
statistics (BatchNorm's running means and variances) are kept whole, as a plain round
sends its buffers raw: rand-k draws only among the other coordinates (a statistic
updated at a tenth of its coordinates per round leaves the model's evaluation wrong).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from strategies.wire.codecs.randk import randk_indices
from strategies.wire.codecs.registry import UpdateCodec
from strategies.wire.codecs.spec import parse_spec
from strategies.wire.secure_aggregation.errors import SecAggConfigError
from strategies.wire.registry import Registry
from strategies.wire.seeds import derive_seed

__all__ = ["SUMMABLE_CODECS", "flatten_float", "float_positions", "kept_indices",
           "shared_codec_seed", "unflatten_float"]

#: The codecs whose output sums across sites under masks, by dotted path to their
#: :data:`~strategies.wire.codecs.registry.CODECS` entry.
SUMMABLE_CODECS: Registry[UpdateCodec] = Registry("summable codec", "strategy.codec",
                                                   error=SecAggConfigError)
SUMMABLE_CODECS.add_path("none", "strategies.wire.codecs.identity:CODEC")
SUMMABLE_CODECS.add_path("fp16", "strategies.wire.codecs.fp16:CODEC")
SUMMABLE_CODECS.add_path("randk", "strategies.wire.codecs.randk:CODEC")


def float_positions(arrays: Sequence[np.ndarray]) -> list[int]:
    """Positions of the floating-point arrays (what is masked), in model order."""
    return [i for i, a in enumerate(arrays) if np.asarray(a).dtype.kind == "f"]


def flatten_float(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The float arrays of ``arrays`` as one float64 vector, in model order."""
    parts = [np.asarray(arrays[i], dtype=np.float64).ravel() for i in float_positions(arrays)]
    return np.concatenate(parts) if parts else np.zeros(0)


def unflatten_float(vec: np.ndarray, like: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``vec`` back into the shapes and dtypes of ``like``'s float arrays; integer arrays of
    ``like`` are zeros (the caller fills them)."""
    out, start = [], 0
    for array in like:
        array = np.asarray(array)
        if array.dtype.kind != "f":
            out.append(np.zeros_like(array))
            continue
        out.append(vec[start:start + array.size].reshape(array.shape).astype(array.dtype))
        start += array.size
    if start != vec.size:
        raise ValueError(f"a vector of {vec.size} values does not fill arrays of {start}")
    return out


def shared_codec_seed(base_seed: int, server_round: int) -> int:
    """rand-k's seed of ``server_round``, the same for every site of the round."""
    return derive_seed(base_seed, server_round, 0)


def _coordinates(arrays: Sequence[np.ndarray], positions: Sequence[int]) -> np.ndarray:
    """The coordinates in :func:`flatten_float`'s vector of the float arrays at ``positions``."""
    offsets, start = {}, 0
    for i in float_positions(arrays):
        offsets[i] = (start, start + np.asarray(arrays[i]).size)
        start = offsets[i][1]
    parts = [np.arange(*offsets[i], dtype=np.int64) for i in positions if i in offsets]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def kept_indices(like: Sequence[np.ndarray], codec: str, seed: int,
                 whole: Collection[int] = ()) -> np.ndarray | None:
    """The coordinates of :func:`flatten_float` (``like``) every site sends, sorted: rand-k's
    of ``seed`` among the float arrays not in ``whole``, every coordinate of those in
    ``whole`` (the normalisation statistics); ``None``: all of them (``none``, ``fp16``).

    Raises
    ------
    SecAggConfigError
        For a codec whose output does not sum across sites (naming ``strategy.codec``).
    """
    spec = parse_spec(codec)
    if spec.name not in SUMMABLE_CODECS:
        raise SecAggConfigError(
            f"strategy.codec = {codec!r} cannot be summed under secure aggregation "
            f"(per-site indices or scales); use one of {', '.join(SUMMABLE_CODECS)}")
    if spec.name != "randk":
        return None
    floats = float_positions(like)
    drawn = _coordinates(like, [i for i in floats if i not in whole])
    chosen = drawn[randk_indices(drawn.size, spec.k(drawn.size), seed)] if drawn.size else drawn
    return np.sort(np.concatenate([chosen, _coordinates(like, [i for i in floats if i in whole])]))
