"""A site's update as the arrays it actually sends: one compressed payload + raw integer buffers.

The trainable floating-point part of ``delta = x_global - x_local`` is
flattened (model parameter order) into one vector and encoded with
:func:`strategies.compression.encode` (optionally through
:class:`strategies.compression.ErrorFeedback`), so a message carries one
``uint8`` buffer instead of one dense array per tensor. Buffers are never put
through a lossy codec: integer ones (BatchNorm ``num_batches_tracked``) always,
and float ones the site marks raw (BatchNorm running mean/variance: a top-k or
QSGD error there can make a variance negative and every output NaN) travel raw
under ``raw-<index>``; the server takes the raw set from the reply itself.
That is the explicit choice for normalisation statistics: kept dense, bit-exact,
and accounted: their bytes are in the bytes up and, as float32, in the dense
baseline (:func:`dense_bytes`), so the uplink ratio shows what they cost (about
4.5 kB a round on the BatchNorm X-ray CNN, which holds top-k 1% at ~34x; the
GroupNorm variant reaches ~99x). Per-tensor codecs (``topk:<f>:layer``) get the
sizes of the compressed tensors only.

Pure numpy: the ClientApp packs, the strategy unpacks.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np

from strategies.compression import ErrorFeedback, decode, encode, flatten, unflatten
from strategies.errors import ReplyError

__all__ = ["PAYLOAD_KEY", "UpdateFormatError", "float_positions", "pack_update",
           "unpack_update", "dense_bytes"]

PAYLOAD_KEY = "payload"
RAW_PREFIX = "raw-"


class UpdateFormatError(ReplyError):
    """The arrays of a reply do not form a valid update for the global model (a ``ValueError``)."""


def float_positions(arrays: Sequence[np.ndarray]) -> list[int]:
    """Indices of the floating-point arrays (the compressed part)."""
    return [i for i, a in enumerate(arrays) if np.issubdtype(a.dtype, np.floating)]


def dense_bytes(arrays: Sequence[np.ndarray]) -> int:
    """Size of the update as dense float32 (integers at their own size): the baseline."""
    return sum(a.size * 4 if np.issubdtype(a.dtype, np.floating) else a.nbytes for a in arrays)


def pack_update(delta: Sequence[np.ndarray], spec: str, seed: int = 0,
                feedback: ErrorFeedback | None = None,
                raw: Collection[int] = ()) -> dict[str, np.ndarray]:
    """Encode ``delta`` into ``{"payload": uint8, "raw-<i>": array, ...}``.

    Arrays at the positions in ``raw`` (e.g. normalisation statistics) and all
    integer arrays are sent unchanged. With ``feedback`` the payload is
    ``C(e + delta)`` and the feedback's residual is updated (Karimireddy et al.
    2019, EF-SGD).
    """
    floats = [i for i in float_positions(delta) if i not in set(raw)]
    vector = flatten([delta[i] for i in floats])
    segments = [delta[i].size for i in floats]  # per-tensor codecs (topk:<f>:layer)
    payload = (feedback.step(vector, seed=seed, segments=segments) if feedback is not None
               else encode(vector, spec, seed=seed, segments=segments))
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
    raw = set()
    for key in arrays:
        if key == PAYLOAD_KEY:
            continue
        index = key[len(RAW_PREFIX):]
        if not key.startswith(RAW_PREFIX) or not index.isdigit() or int(index) >= len(reference):
            raise UpdateFormatError(f"unexpected array '{key}' in the update")
        raw.add(int(index))
    required = set(range(len(reference))) - set(float_positions(reference))
    if PAYLOAD_KEY not in arrays or not required <= raw:
        raise UpdateFormatError(
            f"update keys {sorted(arrays)} do not match the global model (need "
            f"'{PAYLOAD_KEY}' and raw integer arrays {sorted(required)})")
    floats = [i for i in float_positions(reference) if i not in raw]
    float_like = [reference[i] for i in floats]
    size = sum(a.size for a in float_like)
    try:
        vector = decode(np.asarray(arrays[PAYLOAD_KEY]), spec, size, seed=seed,
                        segments=[a.size for a in float_like])
    except ValueError as exc:
        raise UpdateFormatError(f"payload rejected: {exc}") from exc
    out: list[np.ndarray] = [np.empty(0)] * len(reference)
    for i, array in zip(floats, unflatten(vector, float_like)):
        out[i] = array
    for i, ref in enumerate(reference):
        if i not in raw:
            continue
        sent = np.asarray(arrays[f"{RAW_PREFIX}{i}"])
        if sent.shape != ref.shape or sent.dtype != ref.dtype:
            raise UpdateFormatError(
                f"array {i}: {sent.dtype}{sent.shape}, expected {ref.dtype}{ref.shape}")
        out[i] = sent
    return out
