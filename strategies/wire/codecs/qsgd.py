r"""``qsgd:<levels>``: QSGD stochastic quantisation (Alistarh et al. 2017 [1]_).

With ``s = levels``: :math:`Q_s(v_i) = \|v\|_2\, \mathrm{sign}(v_i)\,
\xi_i(v, s)/s` where :math:`\xi_i` rounds :math:`s|v_i|/\|v\|_2`
stochastically to one of its two neighbouring integers so that
:math:`E[Q_s(v)] = v`. The norm is sent as float32, and every entry as the
signed level :math:`\mathrm{sign}(v_i)\xi_i + s \in [0, 2s]`, bit-packed
with the fewest bits, ``ceil(log2(2s + 1))``. The rounding uses ``seed``.
One norm covers the whole vector, so the variance bound
:math:`\min(d/s^2, \sqrt{d}/s)\|v\|^2` (Lemma 3.1 of [1]_) is large for
big ``d`` (measured ``||Q(v) - v|| ~ 16 ||v||`` at ``d = 3e7, s = 16``); the paper's
experiments quantise in buckets of a few hundred entries: ``qsgd:<levels>:b<bucket>``
(:mod:`strategies.wire.codecs.qsgd_buckets`) does, and is the variant to run under
error feedback; otherwise prefer ``topk``/``sign`` for large models.

Codec section: ``uint32 levels s, float32 norm, ceil(d*b/8) packed bytes``
(bucketed: see :mod:`strategies.wire.codecs.qsgd_buckets`).

References
----------
.. [1] Alistarh, Grubic, Li, Tomioka, Vojnovic, "QSGD: Communication-Efficient
   SGD via Gradient Quantization and Encoding", NeurIPS 2017.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from strategies.wire.codecs.bitpack import pack_bits, symbol_dtype, unpack_bits
from strategies.wire.codecs.errors import CodecError, PayloadError
from strategies.wire.codecs.qsgd_buckets import decode_buckets, encode_buckets
from strategies.wire.codecs.registry import CODECS, Codec
from strategies.wire.codecs.spec import CodecSpec, levels_argument
from strategies.wire.codecs.wire import Reader, non_finite

__all__ = ["CODEC", "decode", "encode"]

_QSGD = struct.Struct("<If")


def l2_norm(v: np.ndarray) -> float:
    norm = float(np.sqrt(np.dot(v, v)))
    if not math.isfinite(norm):  # float32 accumulation overflowed (or non-finite input)
        if not np.isfinite(v).all():
            raise non_finite("the vector")
        peak = float(np.abs(v).max())
        scaled = v.astype(np.float64) / peak
        norm = peak * float(np.sqrt(np.dot(scaled, scaled)))
    return norm



def encode(v: np.ndarray, spec: CodecSpec, seed: int) -> tuple[bytes | np.ndarray, ...]:
    """The float32 norm and the bit-packed signed levels."""
    if spec.bucket is not None:
        return encode_buckets(v, spec, seed)
    d = v.size
    s = int(spec.levels)  # type: ignore[arg-type]
    bits = (2 * s).bit_length()
    norm = l2_norm(v) if d else 0.0
    norm32 = np.float32(norm)
    if not math.isfinite(float(norm32)):
        raise CodecError(f"cannot encode: l2 norm {norm!r} exceeds the float32 range")
    if float(norm32) < norm:  # round up so that |v_i| / norm <= 1 holds
        norm32 = np.nextafter(norm32, np.float32(np.inf))
    if norm32 > 0:
        level = np.abs(v)
        level *= np.float32(s / float(norm32))
        np.minimum(level, np.float32(s), out=level)
        floor = np.floor(level)
        level -= floor  # fractional part = probability of rounding up
        up = np.random.Generator(np.random.PCG64(seed)).random(d, dtype=np.float32) < level
        floor += up
        np.copysign(floor, v, out=floor)
        floor += np.float32(s)
        symbols = floor.astype(symbol_dtype(bits))
    else:
        symbols = np.full(d, s, dtype=symbol_dtype(bits))
    packed = pack_bits(symbols, bits)
    return _QSGD.pack(s, float(norm32)), packed


def decode(reader: Reader, spec: CodecSpec, d: int, seed: int) -> np.ndarray:
    """Map the packed levels back through the ``(level - s) * norm / s`` table."""
    if spec.bucket is not None:
        return decode_buckets(reader, spec, d, seed)
    s, norm = reader.unpack(_QSGD, "QSGD header")
    if s != spec.levels:
        raise PayloadError(f"payload was quantised with {s} levels but the spec is {spec}")
    if not (math.isfinite(norm) and norm >= 0.0):
        raise PayloadError(f"QSGD norm must be finite and >= 0, got {norm!r}")
    bits = (2 * s).bit_length()
    packed = reader.take(-(-d * bits // 8), "QSGD levels")
    reader.finish()
    table = ((np.arange(2 * s + 1, dtype=np.float64) - s) * (float(norm) / s)).astype(np.float32)
    if bits < 8 and 8 % bits == 0:
        # Decode whole bytes through a 256-row table (one row gather per byte).
        per_byte = 8 // bits
        byte_symbols = (np.arange(256)[:, None] >> (bits * np.arange(per_byte))) & ((1 << bits) - 1)
        if packed.size and (byte_symbols.max(axis=1) > 2 * s)[packed].any():
            raise PayloadError(f"QSGD level symbol out of range [0, {2 * s}]")
        tail = d % per_byte
        if tail and packed[-1] >> (bits * tail):
            raise PayloadError("non-zero padding bits after the last packed entry")
        byte_table = np.zeros(byte_symbols.shape, dtype=np.float32)
        valid = byte_symbols <= 2 * s
        byte_table[valid] = table[byte_symbols[valid]]
        return np.take(byte_table, packed, axis=0).reshape(-1)[:d]
    symbols = unpack_bits(packed, bits, d)
    if d and int(symbols.max()) > 2 * s:
        raise PayloadError(f"QSGD level symbol {int(symbols.max())} out of range [0, {2 * s}]")
    return np.take(table, symbols)


CODEC = CODECS.add(
    "qsgd", Codec(4, "'qsgd:<1..32767>[:b<bucket>]'", levels_argument, encode, decode, "Unbiased stochastic quantisation to ``2s + 1`` levels of the l2 norm.")
)
