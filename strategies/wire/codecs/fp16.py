"""``fp16``: IEEE half precision, magnitudes above 65504 clipped. Codec section: ``d * float16``."""

from __future__ import annotations

import numpy as np

from strategies.wire.codecs.registry import CODECS, Codec
from strategies.wire.codecs.spec import CodecSpec, no_argument
from strategies.wire.codecs.wire import F16, Reader, check_finite, read_dense, to_fp16

__all__ = ["CODEC", "decode", "encode"]


def encode(v: np.ndarray, spec: CodecSpec, seed: int) -> tuple[np.ndarray, ...]:
    """The vector as little-endian float16."""
    lo, hi = check_finite(v)
    return (to_fp16(v, lo, hi),)


def decode(reader: Reader, spec: CodecSpec, d: int, seed: int) -> np.ndarray:
    """Read ``d`` float16 values as float32."""
    return read_dense(reader, F16, d)


CODEC = CODECS.add(
    "fp16", Codec(1, "'fp16'", no_argument, encode, decode, "Half-precision codec (2x smaller than float32).")
)
