"""``none``: raw little-endian float32, lossless. Codec section: ``d * float32``."""

from __future__ import annotations

import numpy as np

from strategies.codecs.registry import register
from strategies.codecs.spec import CodecSpec, no_argument
from strategies.codecs.wire import F32, Reader, check_finite, finite_values

__all__ = ["Identity"]


@register
class Identity:
    """The lossless reference codec."""

    name = "none"
    codec_id = 0
    spec_help = "'none'"
    parse_argument = staticmethod(no_argument)

    @staticmethod
    def encode(v: np.ndarray, spec: CodecSpec, seed: int) -> tuple[np.ndarray, ...]:
        """The vector itself as float32."""
        check_finite(v)
        return (v.astype(F32, copy=False),)

    @staticmethod
    def decode(reader: Reader, spec: CodecSpec, d: int, seed: int) -> np.ndarray:
        """Read ``d`` float32 values."""
        values = reader.array(F32, d, f"{F32.name} values")
        reader.finish()
        return finite_values(values.astype(np.float32), "values")
