"""A site's update as the arrays it actually sends: one compressed payload + raw integer buffers.

The floating-point part of ``delta = x_global - x_local`` is flattened (model
parameter order) into one vector and encoded with :func:`strategies.compression.encode`
(optionally through :class:`strategies.compression.ErrorFeedback`), so a message
carries one ``uint8`` buffer instead of one dense array per tensor. Integer
buffers (e.g. BatchNorm ``num_batches_tracked``) are never put through a lossy
codec: they travel raw under ``raw-<index>``.

Pure numpy: the ClientApp packs, the strategy unpacks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from strategies.compression import ErrorFeedback, decode, encode, flatten, unflatten

__all__ = ["PAYLOAD_KEY", "UpdateFormatError", "float_positions", "pack_update",
           "unpack_update", "dense_bytes"]

PAYLOAD_KEY = "payload"
RAW_PREFIX = "raw-"


class UpdateFormatError(ValueError):
    """The arrays of a reply do not form a valid update for the global model."""


def float_positions(arrays: Sequence[np.ndarray]) -> list[int]:
    """Indices of the floating-point arrays (the compressed part)."""
    return [i for i, a in enumerate(arrays) if np.issubdtype(a.dtype, np.floating)]


def dense_bytes(arrays: Sequence[np.ndarray]) -> int:
    """Size of the update as dense float32 (integers at their own size): the baseline."""
    return sum(a.size * 4 if np.issubdtype(a.dtype, np.floating) else a.nbytes for a in arrays)


def pack_update(delta: Sequence[np.ndarray], spec: str, seed: int = 0,
                feedback: ErrorFeedback | None = None) -> dict[str, np.ndarray]:
    """Encode ``delta`` into ``{"payload": uint8, "raw-<i>": int array, ...}``.

    With ``feedback`` the payload is ``C(e + delta)`` and the feedback's residual
    is updated (Karimireddy et al. 2019, EF-SGD).
    """
    floats = float_positions(delta)
    vector = flatten([delta[i] for i in floats])
    payload = feedback.step(vector, seed=seed) if feedback is not None else encode(
        vector, spec, seed=seed)
    arrays = {PAYLOAD_KEY: payload}
    for i, array in enumerate(delta):
        if i not in floats:
            arrays[f"{RAW_PREFIX}{i}"] = np.asarray(array)
    return arrays


def unpack_update(arrays: Mapping[str, np.ndarray], reference: Sequence[np.ndarray],
                  spec: str, seed: int = 0) -> list[np.ndarray]:
    """Decode a packed update into arrays shaped and typed like ``reference``.

    Raises
    ------
    UpdateFormatError
        Unexpected or missing keys, wrong raw arrays, or (wrapping
        :class:`strategies.compression.PayloadError`) a malformed payload.
    """
    floats = float_positions(reference)
    expected = {PAYLOAD_KEY} | {f"{RAW_PREFIX}{i}" for i in range(len(reference))
                                if i not in floats}
    if set(arrays) != expected:
        raise UpdateFormatError(
            f"update keys {sorted(arrays)} do not match the global model "
            f"(expected {sorted(expected)})")
    float_like = [reference[i] for i in floats]
    size = sum(a.size for a in float_like)
    try:
        vector = decode(np.asarray(arrays[PAYLOAD_KEY]), spec, size, seed=seed)
    except ValueError as exc:
        raise UpdateFormatError(f"payload rejected: {exc}") from exc
    out: list[np.ndarray] = [np.empty(0)] * len(reference)
    for i, array in zip(floats, unflatten(vector, float_like)):
        out[i] = array
    for i, ref in enumerate(reference):
        if i in floats:
            continue
        raw = np.asarray(arrays[f"{RAW_PREFIX}{i}"])
        if raw.shape != ref.shape or raw.dtype != ref.dtype:
            raise UpdateFormatError(
                f"array {i}: {raw.dtype}{raw.shape}, expected {ref.dtype}{ref.shape}")
        out[i] = raw
    return out
