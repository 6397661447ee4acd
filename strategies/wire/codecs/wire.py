"""The payload wire format shared by every codec: header, reader, value and argument checks.

Version 1, little-endian, one contiguous ``uint8`` buffer::

    offset 0  uint8   magic 0xFC
           1  uint8   format version (1)
           2  uint8   codec id (see each codec module)
           3  uint32  d, the length of the dense vector
           7  codec section

The codec section's layout is documented in each codec's module.
"""

from __future__ import annotations

import math
import struct
from numbers import Integral

import numpy as np

from strategies.wire.codecs.errors import CodecError, PayloadError

__all__ = ["F16", "F32", "HEADER", "MAGIC", "MAX_SIZE", "VERSION", "Reader", "as_payload",
           "as_vector", "check_finite", "check_seed", "check_size", "finite_values", "header",
           "join", "non_finite", "to_fp16"]

MAGIC = 0xFC
VERSION = 1
MAX_SIZE = 2**32 - 1
FP16_MAX = 65504.0
HEADER = struct.Struct("<BBBI")
F32 = np.dtype("<f4")
F16 = np.dtype("<f2")


def header(codec_id: int, d: int) -> bytes:
    """The 7-byte common header."""
    return HEADER.pack(MAGIC, VERSION, codec_id, d)


def join(*parts: bytes | np.ndarray) -> np.ndarray:
    """Concatenate header and sections into one ``uint8`` payload."""
    arrays = [
        np.frombuffer(p, dtype=np.uint8) if isinstance(p, bytes) else p.view(np.uint8)
        for p in parts
    ]
    return np.concatenate(arrays)


def as_vector(vec: object) -> np.ndarray:
    if not isinstance(vec, np.ndarray):
        raise CodecError(f"expected a numpy.ndarray, got {type(vec).__name__}")
    if vec.ndim != 1:
        raise CodecError(f"expected a 1-D vector (use flatten()), got shape {vec.shape}")
    if vec.dtype.kind not in "fiu":
        raise CodecError(f"expected a numeric vector, got dtype {vec.dtype}")
    if vec.size > MAX_SIZE:
        raise CodecError(f"vector of {vec.size} entries exceeds the {MAX_SIZE} limit")
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(vec, dtype=F32)


def non_finite(where: str) -> CodecError:
    return CodecError(f"cannot encode: {where} contains NaN or inf")


def check_finite(v: np.ndarray) -> tuple[float, float]:
    """Return ``(min, max)`` of ``v``; raise :class:`CodecError` if not finite.

    ``max``/``min`` propagate NaN and expose inf, and are faster than
    ``np.isfinite(v).all()``.
    """
    if not v.size:
        return 0.0, 0.0
    lo, hi = float(v.min()), float(v.max())
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise non_finite("the vector")
    return lo, hi


def to_fp16(values: np.ndarray, lo: float | None = None, hi: float | None = None) -> np.ndarray:
    """float32 -> little-endian float16, clipping magnitudes above 65504."""
    if values.size:
        if lo is None or hi is None:
            lo, hi = float(values.min()), float(values.max())
        if hi > FP16_MAX or lo < -FP16_MAX:
            values = np.clip(values, -FP16_MAX, FP16_MAX)
    return values.astype(F16)



class Reader:
    """Sequential reader over a payload that reports truncation clearly."""

    def __init__(self, payload: np.ndarray) -> None:
        self.buf = payload
        self.pos = 0

    def take(self, nbytes: int, what: str) -> np.ndarray:
        end = self.pos + nbytes
        if end > self.buf.size:
            raise PayloadError(
                f"truncated payload: {what} needs {nbytes} bytes at offset {self.pos}, "
                f"only {self.buf.size - self.pos} left"
            )
        out = self.buf[self.pos : end]
        self.pos = end
        return out

    def unpack(self, fmt: struct.Struct, what: str) -> tuple:
        return fmt.unpack(self.take(fmt.size, what).tobytes())

    def array(self, dtype: np.dtype, count: int, what: str) -> np.ndarray:
        return self.take(count * dtype.itemsize, what).view(dtype)

    def finish(self) -> None:
        if self.pos != self.buf.size:
            raise PayloadError(
                f"payload has {self.buf.size - self.pos} trailing bytes after offset {self.pos}"
            )


def as_payload(payload: object) -> np.ndarray:
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return np.frombuffer(payload, dtype=np.uint8)
    if not isinstance(payload, np.ndarray):
        raise PayloadError(f"payload must be a uint8 numpy array, got {type(payload).__name__}")
    if payload.dtype != np.uint8 or payload.ndim != 1:
        raise PayloadError(
            f"payload must be a 1-D uint8 array, got dtype {payload.dtype} "
            f"and shape {payload.shape}"
        )
    return np.ascontiguousarray(payload)


def _bounded_int(value: object, name: str, upper: int, bounds: str) -> int:
    """``value`` as an int in ``[0, upper]``, else :class:`CodecError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise CodecError(f"{name} must be an int, got {type(value).__name__}")
    number = int(value)
    if not 0 <= number <= upper:
        raise CodecError(f"{name} must be in {bounds}, got {number}")
    return number


def check_size(size: object) -> int:
    """A dense vector's length ``d``: an int in ``[0, 2**32 - 1]``."""
    return _bounded_int(size, "size", MAX_SIZE, f"[0, {MAX_SIZE}]")


def check_seed(seed: object) -> int:
    """A codec seed: an int in ``[0, 2**64)`` (from :func:`strategies.wire.seeds.derive_seed`)."""
    return _bounded_int(seed, "seed", 2**64 - 1, "[0, 2**64)")


def finite_values(values: np.ndarray, what: str) -> np.ndarray:
    if not np.isfinite(values).all():
        raise PayloadError(f"payload {what} contain NaN or inf")
    return values


# --------------------------------------------------------------------------- #
# Codecs


def read_dense(reader: Reader, dtype: np.dtype, d: int) -> np.ndarray:
    """The last section of a dense payload: ``d`` values of ``dtype`` as finite float32."""
    values = reader.array(dtype, d, f"{dtype.name} values")
    reader.finish()
    return finite_values(values.astype(np.float32), "values")
