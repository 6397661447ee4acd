"""A site's update as the arrays it actually sends: one compressed payload + raw integer buffers.

The trainable floating-point part of ``delta = x_global - x_local`` is
flattened (model parameter order) into one vector and encoded with
:func:`strategies.wire.codecs.encode` (optionally through
:class:`strategies.wire.codecs.ErrorFeedback`), so a message carries one
``uint8`` buffer instead of one dense array per tensor. Buffers are never put
through a lossy codec: integer ones (BatchNorm ``num_batches_tracked``) always,
and float ones the site marks raw (BatchNorm running mean/variance: a top-k or
QSGD error there can make a variance negative and every output NaN) travel raw
under ``raw-<index>``; the server takes the raw set from the reply itself.
That is the explicit choice for normalisation statistics: kept dense, bit-exact,
and accounted: their bytes are in the bytes up and, as float32, in the dense
baseline (:func:`strategies.wire.model_layout.dense_bytes`), so the uplink ratio shows
what they cost (about 4.5 kB a round on the BatchNorm X-ray CNN, which holds top-k 1% at ~34x; the
GroupNorm variant reaches ~99x). Per-tensor codecs (``topk:<f>:layer``) get the
sizes of the compressed tensors only. The layout (the keys, the raw set, the arrays put
back in the model's shapes) is :mod:`strategies.wire.model_layout`'s, re-exported here; a
dense update (``none``) is read there without the codecs.

Pure numpy: the ClientApp packs, the strategy unpacks.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np

from strategies.wire.codecs import ErrorFeedback, decode, encode, flatten
from strategies.wire.model_layout import (PAYLOAD_KEY, UpdateFormatError, assemble,
                                          float_positions, payload_positions, raw_positions,
                                          update_arrays)

__all__ = ["pack_update", "unpack_update"]


def pack_update(delta: Sequence[np.ndarray], spec: str, seed: int = 0,
                feedback: ErrorFeedback | None = None,
                raw: Collection[int] = ()) -> dict[str, np.ndarray]:
    """Encode ``delta`` into ``{"payload": uint8, "raw-<i>": array, ...}``.

    Arrays at the positions in ``raw`` (e.g. normalisation statistics) and all
    integer arrays are sent unchanged. With ``feedback`` the payload is
    ``C(e + delta)`` and the feedback's residual is updated (Karimireddy et al.
    2019, EF-SGD).
    """
    floats = payload_positions(delta, raw)
    vector = flatten([delta[i] for i in floats])
    segments = [delta[i].size for i in floats]  # per-tensor codecs (topk:<f>:layer)
    payload = (feedback.step(vector, seed=seed, segments=segments) if feedback is not None
               else encode(vector, spec, seed=seed, segments=segments))
    return update_arrays(payload, delta, floats)


def unpack_update(arrays: Mapping[str, np.ndarray], reference: Sequence[np.ndarray],
                  spec: str, seed: int = 0) -> list[np.ndarray]:
    """Decode a packed update into arrays shaped and typed like ``reference``.

    Raises
    ------
    UpdateFormatError
        Unexpected or missing keys, wrong raw arrays, or (wrapping
        :class:`strategies.wire.codecs.PayloadError`) a malformed payload.
    """
    raw = raw_positions(arrays, reference)
    float_like = [reference[i] for i in float_positions(reference) if i not in raw]
    size = sum(a.size for a in float_like)
    try:
        vector = decode(np.asarray(arrays[PAYLOAD_KEY]), spec, size, seed=seed,
                        segments=[a.size for a in float_like])
    except ValueError as exc:
        raise UpdateFormatError(f"payload rejected: {exc}") from exc
    return assemble(vector, arrays, reference, raw)
