"""``none``: raw little-endian float32, lossless. Codec section: ``d * float32``."""

from __future__ import annotations

import numpy as np

from strategies.wire.codecs.registry import CODECS, Codec
from strategies.wire.codecs.spec import CodecSpec, no_argument
from strategies.wire.codecs.wire import F32, Reader, check_finite, read_dense

__all__ = ["CODEC", "SPEC", "decode", "encode"]

#: The codec's spec (canonical: a round's plan carries it so; a dense update).
SPEC = "none"


def encode(v: np.ndarray, spec: CodecSpec, seed: int) -> tuple[np.ndarray, ...]:
    """The vector itself as float32."""
    check_finite(v)
    return (v.astype(F32, copy=False),)


def decode(reader: Reader, spec: CodecSpec, d: int, seed: int) -> np.ndarray:
    """Read ``d`` float32 values."""
    return read_dense(reader, F32, d)


CODEC = CODECS.add(
    SPEC, Codec(0, f"'{SPEC}'", no_argument, encode, decode, "The lossless reference codec.")
)
