"""``fp16``: IEEE half precision, magnitudes above 65504 clipped. Codec section: ``d * float16``."""

from __future__ import annotations

import numpy as np

from strategies.codecs.registry import register
from strategies.codecs.spec import CodecSpec, no_argument
from strategies.codecs.wire import F16, Reader, check_finite, finite_values, to_fp16

__all__ = ["Fp16"]


@register
class Fp16:
    """Half-precision codec (2x smaller than float32)."""

    name = "fp16"
    codec_id = 1
    spec_help = "'fp16'"
    parse_argument = staticmethod(no_argument)

    @staticmethod
    def encode(v: np.ndarray, spec: CodecSpec, seed: int) -> tuple[np.ndarray, ...]:
        """The vector as little-endian float16."""
        lo, hi = check_finite(v)
        return (to_fp16(v, lo, hi),)

    @staticmethod
    def decode(reader: Reader, spec: CodecSpec, d: int, seed: int) -> np.ndarray:
        """Read ``d`` float16 values as float32."""
        values = reader.array(F16, d, f"{F16.name} values")
        reader.finish()
        return finite_values(values.astype(np.float32), "values")
