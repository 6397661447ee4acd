"""Dense bit packing of unsigned symbols of 1..64 bits (the ``qsgd`` levels, the ``sign``
bits, the SecAgg+ masked vectors)."""

from __future__ import annotations

import numpy as np

from strategies.wire.codecs.errors import PayloadError

__all__ = ["BYTE_SIGNS", "pack_bits", "symbol_dtype", "unpack_bits"]

_U64 = np.dtype("<u8")
_u64 = np.uint64
_LANES8 = np.uint64(0x00FF00FF00FF00FF)
_LANES16 = np.uint64(0x0000FFFF0000FFFF)
_LANES32 = np.uint64(0x00000000FFFFFFFF)


def symbol_dtype(bits: int) -> np.dtype:
    """The narrowest unsigned dtype of a ``bits``-bit symbol."""
    return np.dtype(np.uint8 if bits <= 8 else np.uint16 if bits <= 16 else
                    np.uint32 if bits <= 32 else np.uint64)


def pack_bits(symbols: np.ndarray, bits: int) -> np.ndarray:
    """Pack ``bits``-bit unsigned symbols densely, little-endian bit order.

    Symbol ``i`` occupies bits ``[i * bits, (i + 1) * bits)`` of the output,
    whose length is ``ceil(n * bits / 8)``. Groups of 8 symbols fill exactly
    ``bits`` bytes: when ``bits`` divides 8 the symbols of each byte are OR-ed
    together directly; for other ``bits < 8`` the 8 one-byte symbols of a group are
    viewed as one 64-bit word and compacted in three mask-and-shift steps
    (lanes of 8 -> 16 -> 32 -> 64 bits); wider symbols are OR-ed into words
    one column at a time.
    """
    n = symbols.size
    nbytes = -(-n * bits // 8)
    if bits == 8:
        return symbols.astype(np.uint8)
    groups = -(-n // 8)
    if 8 % bits == 0:
        per_byte = 8 // bits
        padded = np.zeros(nbytes * per_byte, dtype=np.uint8)
        padded[:n] = symbols
        lanes = padded.reshape(nbytes, per_byte)
        out = lanes[:, 0].copy()
        for j in range(1, per_byte):
            out |= lanes[:, j] << np.uint8(j * bits)
        return out
    if bits < 8:
        padded = np.zeros(groups * 8, dtype=np.uint8)
        padded[:n] = symbols
        w = padded.view(_U64)
        w = (w & _LANES8) | (((w >> _u64(8)) & _LANES8) << _u64(bits))
        w = (w & _LANES16) | (((w >> _u64(16)) & _LANES16) << _u64(2 * bits))
        w = (w & _LANES32) | ((w >> _u64(32)) << _u64(4 * bits))
        return w.view(np.uint8).reshape(groups, 8)[:, :bits].reshape(-1)[:nbytes]
    padded = np.zeros(groups * 8, dtype=symbols.dtype)
    padded[:n] = symbols
    cols = padded.reshape(groups, 8)
    nwords = -(-bits // 8)
    words = np.zeros((groups, nwords), dtype=_U64)
    for j in range(8):
        word, offset = divmod(j * bits, 64)
        col = cols[:, j].astype(_U64)
        words[:, word] |= col << _u64(offset)
        if offset + bits > 64:
            words[:, word + 1] |= col >> _u64(64 - offset)
    packed = words.view(np.uint8).reshape(groups, 8 * nwords)[:, :bits]
    return packed.reshape(-1)[:nbytes]


def unpack_bits(data: np.ndarray, bits: int, n: int) -> np.ndarray:
    """Inverse of :func:`pack_bits`; raises if padding bits are not zero."""
    if bits == 8:
        return data.astype(np.uint8)
    groups = -(-n // 8)
    nwords = -(-bits // 8)
    flat = np.zeros(groups * bits, dtype=np.uint8)
    flat[: data.size] = data
    raw = np.zeros((groups, 8 * nwords), dtype=np.uint8)
    raw[:, :bits] = flat.reshape(groups, bits)
    if bits < 8:
        w = raw.view(_U64).reshape(-1)
        w = (w & _u64((1 << 4 * bits) - 1)) | ((w >> _u64(4 * bits)) << _u64(32))
        lane = _u64(((1 << 2 * bits) - 1) * 0x0000000100000001)
        w = (w & lane) | (((w >> _u64(2 * bits)) & lane) << _u64(16))
        lane = _u64(((1 << bits) - 1) * 0x0001000100010001)
        w = (w & lane) | (((w >> _u64(bits)) & lane) << _u64(8))
        symbols = w.view(np.uint8)
    else:
        words = raw.view(_U64)
        mask = _u64((1 << bits) - 1)
        cols = np.empty((groups, 8), dtype=symbol_dtype(bits))
        for j in range(8):
            word, offset = divmod(j * bits, 64)
            col = words[:, word] >> _u64(offset)
            if offset + bits > 64:
                col |= words[:, word + 1] << _u64(64 - offset)
            cols[:, j] = col & mask
        symbols = cols.reshape(-1)
    if np.any(symbols[n:]):
        raise PayloadError("non-zero padding bits after the last packed entry")
    return symbols[:n]


# Row b of BYTE_SIGNS holds the 8 signs (+1 for bit 0, -1 for bit 1) of byte b
# in little-endian bit order, so one row gather decodes 8 entries.
BYTE_SIGNS = np.where(
    np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little") == 1,
    np.float32(-1.0),
    np.float32(1.0),
)
