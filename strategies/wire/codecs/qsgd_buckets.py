r"""``qsgd:<levels>:b<bucket>``: QSGD with one norm per bucket (Alistarh et al. 2017 [1]_, §3.1).

The vector is cut into ``ceil(d / b)`` consecutive buckets of ``b`` entries
(the last one shorter) and each bucket :math:`v^{(j)}` is quantised with its
own norm: :math:`Q_s(v_i) = \|v^{(j)}\|_2\, \mathrm{sign}(v_i)\,\xi_i/s` for
``i`` in bucket ``j``, :math:`\xi_i` the stochastic rounding of
:math:`s|v_i|/\|v^{(j)}\|_2` (unbiased, :math:`E[Q_s(v)] = v`). The variance
bound of Lemma 3.1 then holds per bucket,

.. math:: E\|Q_s(v) - v\|^2 \le \min(b/s^2, \sqrt{b}/s)\, \|v\|^2,

with ``b`` in place of ``d``: for :math:`\sqrt{b} < s` the error is smaller than
the vector, so the compressor is a contraction in expectation and the
error-feedback residual ``e`` stays bounded (EF-SGD, Karimireddy et al. 2019
[2]_; :math:`E\|e\|^2 \to \omega\|\delta\|^2 / (1 - \omega)` for a variance
factor :math:`\omega < 1`), where the single-norm ``qsgd:<levels>`` (``b = d``)
makes it grow geometrically for large ``d``.

Codec section: ``uint32 levels s, uint32 bucket b, ceil(d/b) * float32 norms,
ceil(d*bits/8) packed levels`` with ``bits = ceil(log2(2s + 1))`` as in
:mod:`strategies.wire.codecs.qsgd`; the rounding uses ``seed``.

References
----------
.. [1] Alistarh, Grubic, Li, Tomioka, Vojnovic, "QSGD: Communication-Efficient
   SGD via Gradient Quantization and Encoding", NeurIPS 2017.
.. [2] Karimireddy, Rebjock, Stich, Jaggi, "Error Feedback Fixes SignSGD and
   other Gradient Compression Schemes", ICML 2019.
"""

from __future__ import annotations

import struct

import numpy as np

from strategies.wire.codecs.bitpack import pack_bits, symbol_dtype, unpack_bits
from strategies.wire.codecs.errors import CodecError, PayloadError
from strategies.wire.codecs.spec import CodecSpec
from strategies.wire.codecs.wire import F32, Reader, finite_values, non_finite

__all__ = ["bucket_norms", "decode_buckets", "encode_buckets"]

_BUCKETS = struct.Struct("<II")


def _per_entry(values: np.ndarray, bucket: int, d: int) -> np.ndarray:
    """Bucket ``j``'s value repeated over its entries: ``d`` values (the last bucket shorter)."""
    counts = np.full(values.size, bucket, dtype=np.int64)
    if values.size:
        counts[-1] = d - (values.size - 1) * bucket
    return np.repeat(values, counts)


def bucket_norms(v: np.ndarray, bucket: int) -> np.ndarray:
    """The l2 norm of each bucket as float32, rounded up so that ``|v_i| <= norm`` holds.

    Computed in float64 (no overflow for finite float32 input); a norm beyond
    the float32 range is a :class:`CodecError`.
    """
    squares = np.square(v, dtype=np.float64)
    starts = np.arange(0, v.size, bucket, dtype=np.int64)
    norms = np.sqrt(np.add.reduceat(squares, starts)) if v.size else np.zeros(0)
    if not np.isfinite(norms).all():
        raise non_finite("the vector")
    norms32 = norms.astype(np.float32)
    if not np.isfinite(norms32).all():
        raise CodecError("cannot encode: a bucket's l2 norm exceeds the float32 range")
    low = norms32.astype(np.float64) < norms
    norms32[low] = np.nextafter(norms32[low], np.float32(np.inf))
    return norms32


def encode_buckets(v: np.ndarray, spec: CodecSpec, seed: int) -> tuple[bytes | np.ndarray, ...]:
    """The bucket norms and the bit-packed signed levels ``sign(v_i) xi_i + s``."""
    d, s, bucket = v.size, int(spec.levels), int(spec.bucket)  # type: ignore[arg-type]
    bits = (2 * s).bit_length()
    norms = bucket_norms(v, bucket)
    per_entry = _per_entry(norms, bucket, d)
    # |v_i| / norm <= 1 first (no overflow for a tiny norm), then times s
    level = np.divide(np.abs(v), per_entry, out=np.zeros(d, dtype=np.float32),
                      where=per_entry > 0)
    level *= np.float32(s)
    np.minimum(level, np.float32(s), out=level)
    floor = np.floor(level)
    level -= floor  # fractional part = probability of rounding up
    floor += np.random.Generator(np.random.PCG64(seed)).random(d, dtype=np.float32) < level
    np.copysign(floor, v, out=floor)
    floor += s
    return _BUCKETS.pack(s, bucket), norms.astype(F32), pack_bits(
        floor.astype(symbol_dtype(bits)), bits)


def decode_buckets(reader: Reader, spec: CodecSpec, d: int, seed: int) -> np.ndarray:
    """``(level - s) * norm_j / s`` for every entry of bucket ``j``."""
    s, bucket = reader.unpack(_BUCKETS, "bucketed QSGD header")
    if s != spec.levels or bucket != spec.bucket:
        raise PayloadError(f"payload was quantised as 'qsgd:{s}:b{bucket}' but the spec is {spec}")
    norms = finite_values(reader.array(F32, -(-d // bucket), "QSGD bucket norms"), "bucket norms")
    if (norms < 0).any():
        raise PayloadError("QSGD bucket norms must be >= 0")
    bits = (2 * s).bit_length()
    symbols = unpack_bits(reader.take(-(-d * bits // 8), "QSGD levels"), bits, d)
    reader.finish()
    if d and int(symbols.max()) > 2 * s:
        raise PayloadError(f"QSGD level symbol {int(symbols.max())} out of range [0, {2 * s}]")
    out = symbols.astype(np.float32)
    out -= np.float32(s)
    out *= _per_entry(norms / np.float32(s), bucket, d)
    return out
