"""``topk:<fraction>``: magnitude top-k sparsification.

``k = max(1, round(fraction * d))`` (Python rounding, half to even). Indices are
sent either as LEB128 varints of the gaps between increasing indices or as a
bitmap of ``d`` bits, whichever is smaller (a flag byte says which); values as
fp16. ``topk:<fraction>:layer`` keeps ``k`` per tensor with the same section
(:mod:`strategies.wire.codecs.topk_layers`). Codec section: ``uint32 k, uint8 index
mode (0 varint gaps, 1 bitmap), uint32 index-section bytes, index section,
k * float16``.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from strategies.wire.codecs.errors import PayloadError
from strategies.wire.codecs.registry import CODECS, Codec
from strategies.wire.codecs.spec import CodecSpec, layer_fraction_argument
from strategies.wire.codecs.topk_layers import check_layer_counts, layer_topk_indices
from strategies.wire.codecs.varint import varint_decode, varint_encode, varint_lengths
from strategies.wire.codecs.wire import F16, Reader, finite_values, non_finite, to_fp16

__all__ = ["CODEC", "decode", "encode", "topk_indices"]

_TOPK = struct.Struct("<IBI")
_MODE_VARINT, _MODE_BITMAP = 0, 1

_SAMPLE = 1 << 16


def topk_indices(magnitude: np.ndarray, k: int) -> np.ndarray:
    """Sorted int64 indices of the ``k`` largest entries of ``magnitude``.

    A threshold estimated from a strided sample pre-filters the candidates so
    that ``np.argpartition`` runs on about ``k`` entries instead of ``d``; if
    the estimate keeps fewer than ``k`` entries it falls back to a full
    ``argpartition``. The result is exact either way (ties broken
    arbitrarily but deterministically).
    """
    d = magnitude.size
    if k >= d:
        return np.arange(d, dtype=np.int64)
    if d >= 4 * _SAMPLE:
        sample = magnitude[:: d // _SAMPLE]
        expected = k * sample.size / d
        rank = int(expected + 4.0 * math.sqrt(expected) + 16)
        if rank < sample.size // 2:
            threshold = np.partition(sample, sample.size - rank)[sample.size - rank]
            candidates = np.flatnonzero(magnitude >= threshold)
            if candidates.size >= k:
                cut = candidates.size - k
                keep = np.argpartition(magnitude[candidates], cut)[cut:]
                chosen = candidates[keep]
                chosen.sort()
                return chosen
    chosen = np.argpartition(magnitude, d - k)[d - k :].astype(np.int64)
    chosen.sort()
    return chosen



def encode(v: np.ndarray, spec: CodecSpec, seed: int) -> tuple[bytes | np.ndarray, ...]:
    """Top-k indices (varint gaps or bitmap) and fp16 values."""
    d = v.size
    k = spec.k(d)
    magnitude = np.abs(v)
    if d and not math.isfinite(float(magnitude.max())):
        raise non_finite("the vector")
    idx = (layer_topk_indices(magnitude, spec, topk_indices) if spec.per_tensor
           else topk_indices(magnitude, k))
    values = to_fp16(v[idx])
    gaps = np.diff(idx, prepend=0).astype(np.uint32)
    lengths = varint_lengths(gaps)
    varint_bytes = int(lengths.sum(dtype=np.int64))
    bitmap_bytes = -(-d // 8)
    if varint_bytes <= bitmap_bytes:
        mode, section = _MODE_VARINT, varint_encode(gaps, lengths)
    else:
        mask = np.zeros(d, dtype=bool)
        mask[idx] = True
        mode, section = _MODE_BITMAP, np.packbits(mask, bitorder="little")
    return _TOPK.pack(k, mode, section.size), section, values


def decode(reader: Reader, spec: CodecSpec, d: int, seed: int) -> np.ndarray:
    """Scatter the ``k`` values back into a zero vector."""
    k, mode, nbytes = reader.unpack(_TOPK, "top-k header")
    if k != spec.k(d):
        raise PayloadError(f"payload keeps k = {k} entries but {spec} of d = {d} keeps {spec.k(d)}")
    section = reader.take(nbytes, "index section")
    if mode == _MODE_VARINT:
        gaps = varint_decode(section, k)
        if k > 1 and not gaps[1:].all():
            raise PayloadError("top-k indices are not strictly increasing (zero gap)")
        idx = np.cumsum(gaps, dtype=np.uint64)
        if k and idx[-1] >= d:
            raise PayloadError(f"top-k index {int(idx[-1])} out of range for d = {d}")
        idx = idx.astype(np.int64)
    elif mode == _MODE_BITMAP:
        if nbytes != -(-d // 8):
            raise PayloadError(f"bitmap has {nbytes} bytes, expected {-(-d // 8)} for d = {d}")
        bits = np.unpackbits(section, bitorder="little")
        if bits[d:].any():
            raise PayloadError("non-zero padding bits after the bitmap's last entry")
        idx = np.flatnonzero(bits[:d])
        if idx.size != k:
            raise PayloadError(f"bitmap marks {idx.size} entries, expected k = {k}")
    else:
        raise PayloadError(f"unknown top-k index mode {mode} (expected 0 varint or 1 bitmap)")
    if spec.per_tensor:
        check_layer_counts(idx, spec, d)
    values = reader.array(F16, k, "top-k values").astype(np.float32)
    finite_values(values, "top-k values")
    reader.finish()
    out = np.zeros(d, dtype=np.float32)
    out[idx] = values
    return out


CODEC = CODECS.add(
    "topk", Codec(2, "'topk:<0<f<=1>[:layer]'", layer_fraction_argument, encode, decode, "Keep the ``k`` entries of largest magnitude.")
)
