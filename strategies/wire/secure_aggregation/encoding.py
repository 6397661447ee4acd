"""A site's weighted vector as ``b``-bit integers, their packed form, and the sum back to floats.

Each coordinate ``x`` (already weighted, :mod:`.weights`) is clipped to ``[-c, c]``
and stochastically rounded to ``q = round((x + c) (2^b - 1) / (2c))`` in
``[0, 2^b - 1]`` (Flower's :func:`~flwr.common.secure_aggregation.quantization.quantize`:
unbiased, ``E[q]`` is the exact value). The sum of ``n`` sites' ``q`` fits ``Z_m``
(:func:`~strategies.wire.secure_aggregation.settings.modulus_bits`), and
``sum_i x_i ~= sum_i q_i 2c / (2^b - 1) - n c`` (:func:`dequantised_sum`). A masked
vector travels as ``ceil(log2 m)`` bits per value (:mod:`strategies.wire.codecs.bitpack`).

Example
-------
>>> import numpy as np
>>> q = quantise(np.array([-1.0, 0.0, 1.0]), clip=1.0, bits=2)
>>> int(q[0]), int(q[2])
(0, 3)
"""

from __future__ import annotations

import numpy as np
from flwr.common.secure_aggregation.quantization import quantize

from strategies.wire.codecs.bitpack import pack_bits, symbol_dtype, unpack_bits
from strategies.wire.codecs.errors import PayloadError
from strategies.wire.secure_aggregation.errors import SecAggError

__all__ = ["dequantised_sum", "pack", "quantise", "unpack"]


def quantise(values: np.ndarray, clip: float, bits: int) -> np.ndarray:
    """``values`` clipped to ``[-clip, clip]`` and stochastically rounded to ``bits`` bits
    (``uint64``)."""
    values = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(values)):
        raise SecAggError("the update to mask is not finite")
    (levels,) = quantize([values], clip, (1 << bits) - 1)
    return np.clip(levels, 0, (1 << bits) - 1).astype(np.uint64)


def dequantised_sum(total: np.ndarray, count: int, clip: float, bits: int) -> np.ndarray:
    """The float sum of ``count`` sites' clipped values from the sum of their levels."""
    return total.astype(np.float64) * (2.0 * clip / ((1 << bits) - 1)) - count * clip


def pack(values: np.ndarray, modulus_bits: int) -> np.ndarray:
    """``values`` (each ``< 2^modulus_bits``) as ``ceil(n modulus_bits / 8)`` bytes."""
    return pack_bits(values.astype(symbol_dtype(modulus_bits)), modulus_bits)


def unpack(data: np.ndarray, modulus_bits: int, length: int) -> np.ndarray:
    """The ``length`` values of a packed vector (``uint64``); :class:`SecAggError` when its
    size or padding is wrong."""
    data = np.asarray(data)
    expected = -(-length * modulus_bits // 8)
    if data.dtype != np.uint8 or data.ndim != 1 or data.size != expected:
        raise SecAggError(f"a masked vector of {length} values at {modulus_bits} bits has "
                          f"{expected} bytes, got {data.size} ({data.dtype})")
    try:
        return unpack_bits(data, modulus_bits, length).astype(np.uint64)
    except PayloadError as error:
        raise SecAggError(f"a masked vector is malformed ({error})") from None
