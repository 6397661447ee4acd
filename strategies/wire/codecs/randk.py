"""``randk:<fraction>``: random-k sparsification with indices from the shared seed.

Same ``k`` as ``topk``. The indices are regenerated from the shared ``seed``
(no indices are sent); values as fp16, **unscaled**: the unbiased ``d/k``
scaling is off because the codec is meant to run under error feedback, where
the contraction ``E||C(v) - v||^2 = (1 - k/d)||v||^2`` is what matters and the
scaling would only inflate the variance. Codec section: ``uint32 k, uint64
seed, k * float16``.

The indices come from the ``PCG64`` raw stream only (stream-stable across numpy
versions), not from ``Generator.choice`` whose algorithm may change between
releases, so a site and a server with different numpy versions agree.
"""

from __future__ import annotations

import struct

import numpy as np

from strategies.wire.codecs.errors import PayloadError
from strategies.wire.codecs.registry import CODECS, Codec
from strategies.wire.codecs.spec import CodecSpec, fraction_argument
from strategies.wire.codecs.wire import F16, Reader, check_finite, finite_values, to_fp16

__all__ = ["CODEC", "decode", "encode", "randk_indices"]

_RANDK = struct.Struct("<IQ")
_U64 = np.dtype("<u8")


def randk_indices(d: int, k: int, seed: int) -> np.ndarray:
    """Sorted indices of the first ``k`` distinct draws of the PCG64 stream.

    Draw ``i`` maps the top 32 bits ``r`` of the raw 64-bit output to
    ``(r * d) >> 32`` (uniform up to a relative bias of ``d / 2**32``). Only the
    bit generator's raw stream is used, which numpy keeps stable across
    versions.
    """
    if k >= d:
        return np.arange(d, dtype=np.int64)
    bitgen = np.random.PCG64(seed)
    distinct = np.zeros(0, dtype=np.int64)
    while distinct.size < k:
        missing = k - distinct.size
        batch = int(missing * d / (d - distinct.size) * 1.05) + 64
        raw = bitgen.random_raw(batch).astype(_U64)
        draws = (((raw >> np.uint64(32)) * np.uint64(d)) >> np.uint64(32)).astype(np.int64)
        pool = np.concatenate([distinct, draws])
        _, first = np.unique(pool, return_index=True)
        first.sort()
        distinct = pool[first]
    chosen = distinct[:k]
    chosen.sort()
    return chosen



def encode(v: np.ndarray, spec: CodecSpec, seed: int) -> tuple[bytes | np.ndarray, ...]:
    """The seed and the fp16 values at the seed's ``k`` coordinates."""
    d = v.size
    k = spec.k(d)
    check_finite(v)
    values = to_fp16(v[randk_indices(d, k, seed)])
    return _RANDK.pack(k, seed), values


def decode(reader: Reader, spec: CodecSpec, d: int, seed: int) -> np.ndarray:
    """Check the seed, regenerate the coordinates and scatter the values."""
    k, payload_seed = reader.unpack(_RANDK, "random-k header")
    if k != spec.k(d):
        raise PayloadError(f"payload keeps k = {k} entries but {spec} of d = {d} keeps {spec.k(d)}")
    if payload_seed != seed:
        raise PayloadError(
            f"payload was encoded with seed {payload_seed} but decode was given seed {seed}"
        )
    values = reader.array(F16, k, "random-k values").astype(np.float32)
    finite_values(values, "random-k values")
    reader.finish()
    out = np.zeros(d, dtype=np.float32)
    out[randk_indices(d, k, seed)] = values
    return out


CODEC = CODECS.add(
    "randk", Codec(3, "'randk:<0<f<=1>'", fraction_argument, encode, decode, "Keep ``k`` coordinates drawn from the shared seed.")
)
