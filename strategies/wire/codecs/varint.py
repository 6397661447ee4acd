"""Vectorised unsigned LEB128 varints (the ``topk`` index gaps)."""

from __future__ import annotations

import numpy as np

from strategies.wire.codecs.errors import PayloadError

__all__ = ["varint_decode", "varint_encode", "varint_lengths"]


def varint_lengths(values: np.ndarray) -> np.ndarray:
    """Bytes of the unsigned LEB128 encoding of each uint32 value."""
    n = np.ones(values.shape, dtype=np.uint8)
    for bits in (7, 14, 21, 28):
        n += values >= np.uint32(1 << bits)
    return n


def varint_encode(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Vectorised unsigned LEB128 encoding of uint32 ``values``."""
    ends = np.cumsum(lengths, dtype=np.int64)
    out = np.empty(int(ends[-1]) if ends.size else 0, dtype=np.uint8)
    if not values.size:
        return out
    starts = ends - lengths
    out[starts] = (values & 0x7F) | ((lengths > 1).astype(np.uint32) << 7)
    for j in range(1, 5):
        sel = np.flatnonzero(lengths > j)
        if not sel.size:
            break
        group = (values[sel] >> np.uint32(7 * j)) & 0x7F
        out[starts[sel] + j] = group | ((lengths[sel] > j + 1).astype(np.uint32) << 7)
    return out


def varint_decode(buf: np.ndarray, count: int) -> np.ndarray:
    """Vectorised strict LEB128 decoding of exactly ``count`` uint32 values."""
    if count == 0:
        if buf.size:
            raise PayloadError(f"index section has {buf.size} bytes but k = 0")
        return np.zeros(0, dtype=np.uint64)
    ends = np.flatnonzero(buf < 0x80)
    if ends.size != count:
        raise PayloadError(
            f"index section holds {ends.size} complete varints, expected k = {count}"
        )
    if ends[-1] != buf.size - 1:
        raise PayloadError("index section ends inside a varint (truncated index)")
    lengths = np.diff(ends, prepend=-1)
    longest = int(lengths.max())
    if longest > 5:
        raise PayloadError(f"varint of {longest} bytes exceeds the 5-byte uint32 limit")
    last = buf[ends]
    if np.any((lengths > 1) & (last == 0)):
        raise PayloadError("non-canonical (overlong) varint in the index section")
    if np.any((lengths == 5) & (last > 0x0F)):
        raise PayloadError("varint exceeds 32 bits in the index section")
    values = last.astype(np.uint64) << (7 * (lengths - 1)).astype(np.uint64)
    starts = ends - lengths + 1
    for j in range(longest - 1):
        sel = np.flatnonzero(lengths > j + 1)
        values[sel] |= (buf[starts[sel] + j] & 0x7F).astype(np.uint64) << np.uint64(7 * j)
    return values

