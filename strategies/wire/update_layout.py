"""A site's update as the arrays of its train reply, and the dense one read straight.

Every uplink codec shares one layout (:mod:`strategies.wire.update_codec` packs and unpacks
it): ``payload``, one ``uint8`` buffer, the codec's payload of the float arrays not sent
raw (flattened in model order), and ``raw-<i>``, array ``i`` unchanged (every integer
buffer, and the float ones the site marks raw: BatchNorm's running statistics). The
server takes the raw set from the reply itself (:func:`raw_positions`) and puts the
arrays back in the global model's shapes and dtypes (:func:`assemble`).

A **dense update** (codec ``none``, :mod:`strategies.wire.codecs.identity`: the payload's
section is the vector as little-endian float32 after the common header of
:mod:`strategies.wire.codecs.wire`) is read straight from its payload by
:func:`dense_update`, the codecs not entered: the header (magic, version, the identity
codec's id, ``d``) and the exact length are compared, the values must be finite. A reply
it cannot read so is left to the codec's decode
(:func:`strategies.wire.update_codec.unpack_update`), whose checks give the reason; what it
reads is bit for bit what that decode gives.

Pure numpy: the ClientApp packs, the strategy unpacks.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np

from strategies.wire.codecs.identity import CODEC as IDENTITY
from strategies.wire.codecs.wire import F32, HEADER, MAGIC, VERSION
from strategies.wire.errors import ReplyError

__all__ = ["PAYLOAD_KEY", "RAW_PREFIX", "UpdateFormatError", "assemble", "dense_bytes",
           "dense_update", "float_positions", "raw_positions"]

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


def raw_positions(arrays: Mapping[str, np.ndarray], reference: Sequence[np.ndarray]) -> set[int]:
    """The positions the reply ``arrays`` sends raw, checked against the global model.

    Raises
    ------
    UpdateFormatError
        An unexpected key, or no payload, or an integer array of ``reference`` not raw.
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
    return raw


def assemble(vector: np.ndarray, arrays: Mapping[str, np.ndarray],
             reference: Sequence[np.ndarray], raw: Collection[int]) -> list[np.ndarray]:
    """The update in ``reference``'s shapes and dtypes: the decoded float ``vector`` (the
    float arrays not in ``raw``, model order, exactly their entries) and the raw arrays.

    Raises
    ------
    UpdateFormatError
        A raw array of another shape or dtype than the global model's.
    """
    out: list[np.ndarray] = [np.empty(0)] * len(reference)
    offset = 0
    for i in float_positions(reference):
        if i in raw:
            continue
        size = reference[i].size
        chunk = vector[offset:offset + size].reshape(reference[i].shape)
        out[i] = chunk.astype(reference[i].dtype)
        offset += size
    for i in sorted(raw):
        sent = np.asarray(arrays[f"{RAW_PREFIX}{i}"])
        if sent.shape != reference[i].shape or sent.dtype != reference[i].dtype:
            raise UpdateFormatError(f"array {i}: {sent.dtype}{sent.shape}, expected "
                                    f"{reference[i].dtype}{reference[i].shape}")
        out[i] = sent
    return out


def dense_update(arrays: Mapping[str, np.ndarray],
                 reference: Sequence[np.ndarray]) -> list[np.ndarray] | None:
    """The dense update (codec ``none``) the reply ``arrays`` carries, or None when its
    payload is not a well-formed dense one of the model's size with finite values (the
    codec's decode then says why).

    Raises
    ------
    UpdateFormatError
        As :func:`raw_positions` and :func:`assemble` (the layout, not the payload).
    """
    raw = raw_positions(arrays, reference)
    size = sum(reference[i].size for i in float_positions(reference) if i not in raw)
    payload = arrays[PAYLOAD_KEY]
    if (not isinstance(payload, np.ndarray) or payload.dtype != np.uint8 or payload.ndim != 1
            or payload.size != HEADER.size + F32.itemsize * size):
        return None
    payload = np.ascontiguousarray(payload)
    if HEADER.unpack(payload[:HEADER.size].tobytes()) != (MAGIC, VERSION, IDENTITY.codec_id,
                                                            size):
        return None
    vector = payload[HEADER.size:].view(F32)
    if not np.isfinite(vector).all():
        return None
    return assemble(vector, arrays, reference, raw)
