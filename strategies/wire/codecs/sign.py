r"""``sign``: scaled sign, EF-SignSGD (Karimireddy et al. 2019 [1]_).

:math:`C(v) = \tfrac{\|v\|_1}{d} \mathrm{sign}(v)`, one bit per entry
(``np.packbits``, zero maps to ``+``) and the scale as float32. Codec section:
``float32 scale, ceil(d/8) packed sign bits (1 = negative)``.

References
----------
.. [1] Karimireddy, Rebjock, Stich, Jaggi, "Error Feedback Fixes SignSGD and
   other Gradient Compression Schemes", ICML 2019.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from strategies.wire.codecs.bitpack import BYTE_SIGNS
from strategies.wire.codecs.errors import PayloadError
from strategies.wire.codecs.registry import CODECS, Codec
from strategies.wire.codecs.spec import CodecSpec, no_argument
from strategies.wire.codecs.wire import Reader, non_finite

__all__ = ["CODEC", "decode", "encode"]

_SIGN = struct.Struct("<f")


def encode(v: np.ndarray, spec: CodecSpec, seed: int) -> tuple[bytes | np.ndarray, ...]:
    """The float32 scale and the packed sign bits."""
    d = v.size
    l1 = float(np.add.reduce(np.abs(v), dtype=np.float64)) if d else 0.0
    if not math.isfinite(l1):
        raise non_finite("the vector")
    scale = l1 / d if d else 0.0
    signs = np.packbits(v < 0, bitorder="little")
    return _SIGN.pack(scale), signs


def decode(reader: Reader, spec: CodecSpec, d: int, seed: int) -> np.ndarray:
    """Expand each byte of sign bits through a 256-row table."""
    (scale,) = reader.unpack(_SIGN, "sign scale")
    if not (math.isfinite(scale) and scale >= 0.0):
        raise PayloadError(f"sign scale must be finite and >= 0, got {scale!r}")
    packed = reader.take(-(-d // 8), "sign bits")
    reader.finish()
    if d % 8 and packed[-1] >> (d % 8):
        raise PayloadError("non-zero padding bits after the last sign bit")
    table = BYTE_SIGNS * np.float32(scale)
    return np.take(table, packed, axis=0).reshape(-1)[:d]


CODEC = CODECS.add(
    "sign", Codec(5, "'sign'", no_argument, encode, decode, "One bit per entry plus the mean magnitude.")
)
