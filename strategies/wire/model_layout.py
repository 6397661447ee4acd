"""How a model's named arrays lie in a message: the packed model down, the update up.

**The packed model** (the global model on the way down, the downlink's stored reference
:mod:`strategies.wire.downlink_reference`, a site's last global model
:mod:`clients.site.last_global`). Flower stores a message's ``ArrayRecord`` as one object
per ``Array`` plus one per ``ArrayChunk`` (at most 5 MB each), and a SuperNode pulls every
object from the SuperLink with its own request: the 2.5D U-Net's 36 tensors are 72 pulls
(0.1-0.2 s each on a loaded 2-core machine, 7-12 s a message; ``bench/site_overhead.py``).
:func:`pack_model` lays the named tensors end to end in one ``uint8`` array (``model``)
with a small JSON layout beside it (``layout``: name, dtype and shape of each tensor, in
order), so the model costs one pull per 5 MB chunk; :func:`unpack_model` gives the same
tensors back, bit for bit, names and order kept. (Its ``ArrayRecord`` form is in
:mod:`strategies.rounds.instructions`: the kernel knows no Flower.)

**The update** (a train reply's arrays). Every uplink codec shares one layout
(:mod:`strategies.wire.update_codec` packs and unpacks it): ``payload``, one ``uint8``
buffer, the codec's payload of the float arrays not sent raw (flattened in model order),
and ``raw-<i>``, array ``i`` unchanged (every integer buffer, and the float ones the site
marks raw: BatchNorm's running statistics). The server takes the raw set from the reply
itself (:func:`raw_positions`) and puts the arrays back in the global model's shapes and
dtypes (:func:`assemble`); :func:`dense_bytes` is the dense float32 baseline of the
uplink ratio.

**The dense update** (codec ``none``, :mod:`strategies.wire.codecs.identity`: the
payload's section is the vector as little-endian float32 after the common header of
:mod:`strategies.wire.codecs.wire`) is written and read straight, the codecs not entered:
the site writes it with :func:`pack_dense`, bit for bit what the identity codec's
:func:`strategies.wire.update_codec.pack_update` writes (and refusing what it refuses);
the server reads it with :func:`dense_update`: the header (magic, version, the identity
codec's id, ``d``) and the exact length are compared, the values must be finite. A reply
it cannot read so is left to the codec's decode
(:func:`strategies.wire.update_codec.unpack_update`), whose checks give the reason; what
it reads is bit for bit what that decode gives.

Pure numpy: the site (:mod:`clients.site`) and the strategy import it alike.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence

import numpy as np

from strategies.wire.codecs.errors import CodecError
from strategies.wire.codecs.identity import CODEC as IDENTITY
from strategies.wire.codecs.identity import SPEC as DENSE_SPEC
from strategies.wire.codecs.wire import F32, HEADER, MAGIC, MAX_SIZE, VERSION
from strategies.wire.errors import ReplyError, SiteError

__all__ = ["DENSE_SPEC", "LAYOUT_KEY", "MODEL_KEY", "PAYLOAD_KEY", "RAW_PREFIX",
           "PackedModelError", "UpdateFormatError", "assemble", "dense_bytes", "dense_update",
           "float_positions", "pack_dense", "pack_model", "payload_positions", "raw_positions",
           "unpack_model", "update_arrays"]

MODEL_KEY = "model"
LAYOUT_KEY = "layout"
PAYLOAD_KEY = "payload"
RAW_PREFIX = "raw-"


class PackedModelError(SiteError):
    """The model a site received is not a valid packed model: the site cannot train on it."""


class UpdateFormatError(ReplyError):
    """The arrays of a reply do not form a valid update for the global model (a ``ValueError``)."""


# --------------------------------------------------------------------------- #
# The packed model


def pack_model(named: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``named`` (in order) as one ``uint8`` buffer (``model``) and its JSON layout (``layout``)."""
    layout, parts = [], []
    for name, array in named.items():
        value = np.asarray(array)
        layout.append([name, value.dtype.str, list(value.shape)])
        parts.append(np.ravel(value).view(np.uint8))  # ravel: contiguous, 0-d as (1,)
    buffer = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
    text = np.frombuffer(json.dumps(layout).encode(), dtype=np.uint8)
    return {MODEL_KEY: buffer, LAYOUT_KEY: text.copy()}


def unpack_model(packed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The named tensors that :func:`pack_model` packed, names and order kept.

    Raises
    ------
    PackedModelError
        When ``packed`` lacks ``model`` or ``layout``, or their sizes disagree.
    """
    if set(packed.keys()) != {MODEL_KEY, LAYOUT_KEY}:
        raise PackedModelError(f"packed model must hold exactly '{MODEL_KEY}' and "
                               f"'{LAYOUT_KEY}', got {sorted(packed.keys())}")
    buffer = np.asarray(packed[MODEL_KEY])
    try:
        layout = json.loads(np.asarray(packed[LAYOUT_KEY]).tobytes().decode())
        tensors, offset = {}, 0
        for name, dtype_str, shape in layout:
            dtype = np.dtype(dtype_str)
            count = int(np.prod(shape, dtype=np.int64))
            tensors[name] = np.frombuffer(buffer, dtype=dtype, count=count,
                                          offset=offset).reshape(shape).copy()
            offset += count * dtype.itemsize
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        raise PackedModelError(f"packed model layout does not match its buffer: {exc}") from None
    if offset != buffer.size:
        raise PackedModelError(f"packed model buffer holds {buffer.size} bytes, its layout "
                               f"{offset}")
    return tensors


# --------------------------------------------------------------------------- #
# The update


def float_positions(arrays: Sequence[np.ndarray]) -> list[int]:
    """Indices of the floating-point arrays (the compressed part)."""
    return [i for i, a in enumerate(arrays) if np.issubdtype(a.dtype, np.floating)]


def dense_bytes(arrays: Sequence[np.ndarray]) -> int:
    """Size of the update as dense float32 (integers at their own size): the baseline."""
    return sum(a.size * 4 if np.issubdtype(a.dtype, np.floating) else a.nbytes for a in arrays)


def payload_positions(delta: Sequence[np.ndarray], raw: Collection[int] = ()) -> list[int]:
    """The positions of ``delta`` the payload carries: its float arrays not in ``raw``."""
    sent_raw = set(raw)
    return [i for i in float_positions(delta) if i not in sent_raw]


def update_arrays(payload: np.ndarray, delta: Sequence[np.ndarray],
                  in_payload: Collection[int]) -> dict[str, np.ndarray]:
    """The reply's arrays: ``{"payload": payload, "raw-<i>": delta[i], ...}``, every array of
    ``delta`` not ``in_payload`` (:func:`payload_positions`) sent unchanged, in model order."""
    arrays = {PAYLOAD_KEY: payload}
    for i, array in enumerate(delta):
        if i not in in_payload:
            arrays[f"{RAW_PREFIX}{i}"] = np.asarray(array)
    return arrays


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


# --------------------------------------------------------------------------- #
# The dense update (codec none)


def pack_dense(delta: Sequence[np.ndarray], seed: int = 0,
               raw: Collection[int] = ()) -> dict[str, np.ndarray]:
    """``delta`` as the arrays of a dense update (codec ``none``), written straight: bit for
    bit ``pack_update(delta, "none", seed, raw=raw)``, the codecs not entered.

    ``seed`` is the instruction's codec seed: the dense payload does not use it, but it is
    checked as every codec checks it.

    Raises
    ------
    CodecError
        As the identity codec: a seed outside ``[0, 2**64)``, a vector of more than
        ``2**32 - 1`` entries or with NaN or inf (after the cast to float32).
    """
    if not 0 <= seed <= 2**64 - 1:
        raise CodecError(f"seed must be in [0, 2**64), got {seed}")
    floats = payload_positions(delta, raw)
    vector = (np.concatenate([np.ravel(delta[i]) for i in floats], dtype=F32, casting="unsafe")
              if floats else np.zeros(0, F32))
    if vector.size > MAX_SIZE:
        raise CodecError(f"vector of {vector.size} entries exceeds the {MAX_SIZE} limit")
    if not np.isfinite(vector).all():
        raise CodecError("cannot encode: the vector contains NaN or inf")
    head = np.frombuffer(HEADER.pack(MAGIC, VERSION, IDENTITY.codec_id, vector.size), np.uint8)
    return update_arrays(np.concatenate([head, vector.view(np.uint8)]), delta, floats)


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
