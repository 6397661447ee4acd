r"""Update codecs: lossy compression of model updates, with error feedback.

A site compresses its update ``delta = x_global - x_local`` before sending it
and the server decodes it before aggregation. The codec is pure numpy, so the
same code runs in the ClientApp (encode) and in the strategy (decode).

Granularity
-----------
Compression is applied to the **whole flattened update vector**, one payload
(one ``uint8`` buffer) per message, not tensor by tensor: per-tensor headers,
norms and a per-tensor top-k budget are pure overhead for models with many
small tensors (biases, norms), and a *global* top-k keeps the entries that
are largest over the whole model instead of forcing ``k`` entries out of every
tensor. Use :func:`flatten` / :func:`unflatten` to go between the list of
arrays in the model's parameter order and the vector.

Codecs (the ``spec`` strings)
-----------------------------
``none``
    raw little-endian float32 (lossless).
``fp16``
    IEEE half precision; magnitudes above 65504 are clipped to 65504.
``topk:<fraction>``
    magnitude top-k, ``k = max(1, round(fraction * d))`` (Python rounding,
    half to even). Indices are sent either as LEB128 varints of the gaps
    between increasing indices or as a bitmap of ``d`` bits, whichever is
    smaller (a flag byte says which); values as fp16.
``randk:<fraction>``
    random-k with the same ``k``. The indices are regenerated from the shared
    ``seed`` (no indices are sent); values as fp16, **unscaled**: the unbiased
    ``d/k`` scaling is off because the codec is meant to run under error
    feedback, where the contraction ``E||C(v) - v||^2 = (1 - k/d)||v||^2``
    is what matters and the scaling would only inflate the variance.
``qsgd:<levels>``
    QSGD stochastic quantisation with ``s = levels`` (Alistarh et al. 2017,
    eq. for :math:`Q_s`): :math:`Q_s(v_i) = \|v\|_2\, \mathrm{sign}(v_i)\,
    \xi_i(v, s)/s` where :math:`\xi_i` rounds :math:`s|v_i|/\|v\|_2`
    stochastically to one of its two neighbouring integers so that
    :math:`E[Q_s(v)] = v`. The norm is sent as float32, and every entry as the
    signed level :math:`\mathrm{sign}(v_i)\xi_i + s \in [0, 2s]`, bit-packed
    with the fewest bits, ``ceil(log2(2s + 1))``. The rounding uses ``seed``.
    One norm covers the whole vector, so the variance bound
    :math:`\min(d/s^2, \sqrt{d}/s)\|v\|^2` (Lemma 3.1 of [1]_) is large for
    big ``d`` (measured ``||Q(v) - v|| ~ 16 ||v||`` at ``d = 3e7, s = 16``); the paper's
    experiments quantise in buckets of a few hundred entries. Use it under
    error feedback, or prefer ``topk``/``sign`` for large models.
``sign``
    scaled sign (Karimireddy et al. 2019, EF-SignSGD):
    :math:`C(v) = \tfrac{\|v\|_1}{d} \mathrm{sign}(v)`, one bit per entry
    (``np.packbits``, zero maps to ``+``) and the scale as float32.

Payload format (version 1)
--------------------------
All integers and floats little-endian, one contiguous ``uint8`` buffer::

    offset 0  uint8   magic 0xFC
           1  uint8   format version (1)
           2  uint8   codec id (none 0, fp16 1, topk 2, randk 3, qsgd 4, sign 5)
           3  uint32  d, the length of the dense vector
           7  codec section:
              none   d * float32
              fp16   d * float16
              topk   uint32 k, uint8 index mode (0 varint gaps, 1 bitmap),
                     uint32 index-section bytes, index section, k * float16
              randk  uint32 k, uint64 seed, k * float16
              qsgd   uint32 levels s, float32 norm, ceil(d*b/8) packed bytes
              sign   float32 scale, ceil(d/8) packed sign bits (1 = negative)

:func:`decode` checks every field against the ``spec`` and ``size`` it is
given, the exact total length, index order and range, bit padding and value
finiteness, and raises :class:`PayloadError` on any mismatch. A payload never
contains a dense array of zeros.

Error feedback
--------------
:class:`ErrorFeedback` keeps the compression error of the previous rounds and
adds it to the next update (Stich, Cordonnier, Jaggi 2018, "Sparsified SGD
with Memory"; Karimireddy, Rebjock, Stich, Jaggi 2019, "Error Feedback Fixes
SignSGD and other Gradient Compression Schemes", EF-SGD):

.. math:: z_t = e_t + \delta_t, \quad p_t = \mathrm{encode}(z_t), \quad
          e_{t+1} = z_t - \mathrm{decode}(p_t).

References
----------
.. [1] Alistarh, Grubic, Li, Tomioka, Vojnovic, "QSGD: Communication-Efficient
   SGD via Gradient Quantization and Encoding", NeurIPS 2017.
.. [2] Stich, Cordonnier, Jaggi, "Sparsified SGD with Memory", NeurIPS 2018.
.. [3] Karimireddy, Rebjock, Stich, Jaggi, "Error Feedback Fixes SignSGD and
   other Gradient Compression Schemes", ICML 2019.

Notes
-----
Pure numpy/stdlib: this module must not import torch, MONAI, Flower or the
client / model layers. ``randk`` indices are derived from the ``PCG64`` raw
stream only (stream-stable across numpy versions), not from
``Generator.choice`` whose algorithm may change between releases, so a site
and a server with different numpy versions agree on the indices.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from numbers import Integral

import numpy as np

__all__ = [
    "CodecError",
    "CodecSpec",
    "ErrorFeedback",
    "PayloadError",
    "decode",
    "derive_seed",
    "encode",
    "flatten",
    "parse_spec",
    "unflatten",
]

MAGIC = 0xFC
VERSION = 1
CODEC_IDS: dict[str, int] = {"none": 0, "fp16": 1, "topk": 2, "randk": 3, "qsgd": 4, "sign": 5}
MAX_LEVELS = 32767  # keeps a signed level in 16 bits
MAX_SIZE = 2**32 - 1
FP16_MAX = 65504.0

_HEADER = struct.Struct("<BBBI")
_TOPK = struct.Struct("<IBI")
_RANDK = struct.Struct("<IQ")
_QSGD = struct.Struct("<If")
_SIGN = struct.Struct("<f")
_MODE_VARINT, _MODE_BITMAP = 0, 1
_F32 = np.dtype("<f4")
_F16 = np.dtype("<f2")
_U64 = np.dtype("<u8")
_u64 = np.uint64
_LANES8 = np.uint64(0x00FF00FF00FF00FF)
_LANES16 = np.uint64(0x0000FFFF0000FFFF)
_LANES32 = np.uint64(0x00000000FFFFFFFF)


class CodecError(ValueError):
    """Raised for an invalid codec spec, seed, size or input vector."""


class PayloadError(CodecError):
    """Raised when a payload is malformed or does not match the spec/size."""


# --------------------------------------------------------------------------- #
# Spec
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class CodecSpec:
    """A parsed codec spec.

    Attributes
    ----------
    name : str
        One of ``none``, ``fp16``, ``topk``, ``randk``, ``qsgd``, ``sign``.
    fraction : float or None
        Kept fraction for ``topk`` / ``randk``.
    levels : int or None
        Number of quantisation levels ``s`` for ``qsgd``.
    """

    name: str
    fraction: float | None = None
    levels: int | None = None

    @property
    def codec_id(self) -> int:
        """The codec id written in the payload header."""
        return CODEC_IDS[self.name]

    def k(self, d: int) -> int:
        """Number of kept entries of a ``d``-vector for ``topk`` / ``randk``."""
        if self.fraction is None:
            raise CodecError(f"codec {self.name!r} has no k")
        return min(d, max(1, round(self.fraction * d)))

    def __str__(self) -> str:
        if self.fraction is not None:
            return f"{self.name}:{self.fraction!r}"
        if self.levels is not None:
            return f"{self.name}:{self.levels}"
        return self.name


_SPEC_HELP = (
    "valid specs: 'none', 'fp16', 'sign', 'topk:<0<f<=1>', 'randk:<0<f<=1>', "
    "'qsgd:<1..32767>'"
)


@lru_cache(maxsize=64)
def _parse_spec_cached(spec: str) -> CodecSpec:
    text = spec.strip().lower()
    name, sep, arg = text.partition(":")
    if name in ("none", "fp16", "sign"):
        if sep:
            raise CodecError(f"codec spec {spec!r}: {name!r} takes no argument; {_SPEC_HELP}")
        return CodecSpec(name)
    if name in ("topk", "randk"):
        try:
            fraction = float(arg)
        except ValueError:
            raise CodecError(
                f"codec spec {spec!r}: {name} needs a fraction, e.g. '{name}:0.01'; {_SPEC_HELP}"
            ) from None
        if not (math.isfinite(fraction) and 0.0 < fraction <= 1.0):
            raise CodecError(f"codec spec {spec!r}: fraction must be in (0, 1], got {fraction!r}")
        return CodecSpec(name, fraction=fraction)
    if name == "qsgd":
        if not re.fullmatch(r"[0-9]+", arg):
            raise CodecError(
                f"codec spec {spec!r}: qsgd needs an integer number of levels, "
                f"e.g. 'qsgd:16'; {_SPEC_HELP}"
            )
        levels = int(arg)
        if not 1 <= levels <= MAX_LEVELS:
            raise CodecError(
                f"codec spec {spec!r}: levels must be in [1, {MAX_LEVELS}], got {levels}"
            )
        return CodecSpec(name, levels=levels)
    raise CodecError(f"unknown codec spec {spec!r}; {_SPEC_HELP}")


def parse_spec(spec: str | CodecSpec) -> CodecSpec:
    """Parse and validate a codec spec string (case-insensitive).

    Parameters
    ----------
    spec : str or CodecSpec
        ``none``, ``fp16``, ``sign``, ``topk:<fraction>``, ``randk:<fraction>``
        (``0 < fraction <= 1``) or ``qsgd:<levels>`` (``1 <= levels <= 32767``).

    Returns
    -------
    CodecSpec

    Raises
    ------
    CodecError
        If the spec is not a string or not one of the forms above.
    """
    if isinstance(spec, CodecSpec):
        return spec
    if not isinstance(spec, str):
        raise CodecError(f"codec spec must be a str, got {type(spec).__name__}")
    return _parse_spec_cached(spec)


# --------------------------------------------------------------------------- #
# Seeds, flatten / unflatten
# --------------------------------------------------------------------------- #
def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, Integral):
        raise CodecError(f"seed must be an int, got {type(seed).__name__}")
    value = int(seed)
    if not 0 <= value < 2**64:
        raise CodecError(f"seed must be in [0, 2**64), got {value}")
    return value


def derive_seed(base: int, *keys: int) -> int:
    """Derive a per-message codec seed from a run seed and integer keys.

    Both ends compute it independently, e.g.
    ``derive_seed(run_seed, server_round, node_id)``, so that ``randk`` picks
    fresh coordinates (and ``qsgd`` fresh rounding) every round and site.
    Uses ``numpy.random.SeedSequence`` (stable across numpy versions).

    Parameters
    ----------
    base : int
        Nonnegative run seed.
    *keys : int
        Nonnegative integers (round number, node id, ...).

    Returns
    -------
    int
        A seed in ``[0, 2**64)``.
    """
    parts = [base, *keys]
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, Integral) or int(part) < 0:
            raise CodecError(f"derive_seed expects nonnegative ints, got {part!r}")
    state = np.random.SeedSequence([int(p) for p in parts]).generate_state(1, np.uint64)
    return int(state[0])


def flatten(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Concatenate arrays (model parameter order) into one float32 vector.

    Integer arrays (e.g. BatchNorm ``num_batches_tracked``) are converted to
    float32, exact up to ``2**24``.

    Raises
    ------
    CodecError
        If an item is not a numeric (float or integer) numpy array.
    """
    parts = []
    for i, array in enumerate(arrays):
        if not isinstance(array, np.ndarray) or array.dtype.kind not in "fiu":
            raise CodecError(
                f"flatten: item {i} must be a float or integer numpy array, got "
                f"{getattr(array, 'dtype', type(array).__name__)}"
            )
        parts.append(array.ravel())
    if not parts:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate(parts, dtype=np.float32, casting="unsafe")


def unflatten(vec: np.ndarray, like: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Split a flat vector back into arrays shaped and typed like ``like``.

    Integer targets are rounded half-to-even and clipped to their range.

    Raises
    ------
    CodecError
        If ``vec`` is not 1-D or its length differs from the total size of ``like``.
    """
    vec = np.asarray(vec)
    total = sum(int(np.prod(a.shape)) for a in like)
    if vec.ndim != 1 or vec.size != total:
        raise CodecError(
            f"unflatten: vector of shape {vec.shape} does not match the {total} "
            f"entries of the {len(like)} target arrays"
        )
    out: list[np.ndarray] = []
    offset = 0
    for array in like:
        n = int(np.prod(array.shape))
        chunk = vec[offset : offset + n].reshape(array.shape)
        offset += n
        if array.dtype.kind in "iu":
            info = np.iinfo(array.dtype)
            out.append(np.clip(np.rint(chunk), info.min, info.max).astype(array.dtype))
        else:
            out.append(chunk.astype(array.dtype))
    return out


# --------------------------------------------------------------------------- #
# Low-level helpers: vector check, fp16, varints, bit packing, index sets
# --------------------------------------------------------------------------- #
def _as_vector(vec: object) -> np.ndarray:
    if not isinstance(vec, np.ndarray):
        raise CodecError(f"expected a numpy.ndarray, got {type(vec).__name__}")
    if vec.ndim != 1:
        raise CodecError(f"expected a 1-D vector (use flatten()), got shape {vec.shape}")
    if vec.dtype.kind not in "fiu":
        raise CodecError(f"expected a numeric vector, got dtype {vec.dtype}")
    if vec.size > MAX_SIZE:
        raise CodecError(f"vector of {vec.size} entries exceeds the {MAX_SIZE} limit")
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(vec, dtype=_F32)


def _non_finite(where: str) -> CodecError:
    return CodecError(f"cannot encode: {where} contains NaN or inf")


def _check_finite(v: np.ndarray) -> tuple[float, float]:
    """Return ``(min, max)`` of ``v``; raise :class:`CodecError` if not finite.

    ``max``/``min`` propagate NaN and expose inf, and are faster than
    ``np.isfinite(v).all()``.
    """
    if not v.size:
        return 0.0, 0.0
    lo, hi = float(v.min()), float(v.max())
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise _non_finite("the vector")
    return lo, hi


def _to_fp16(values: np.ndarray, lo: float | None = None, hi: float | None = None) -> np.ndarray:
    """float32 -> little-endian float16, clipping magnitudes above 65504."""
    if values.size:
        if lo is None or hi is None:
            lo, hi = float(values.min()), float(values.max())
        if hi > FP16_MAX or lo < -FP16_MAX:
            values = np.clip(values, -FP16_MAX, FP16_MAX)
    return values.astype(_F16)


def _varint_lengths(values: np.ndarray) -> np.ndarray:
    """Bytes of the unsigned LEB128 encoding of each uint32 value."""
    n = np.ones(values.shape, dtype=np.uint8)
    for bits in (7, 14, 21, 28):
        n += values >= np.uint32(1 << bits)
    return n


def _varint_encode(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
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


def _varint_decode(buf: np.ndarray, count: int) -> np.ndarray:
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


def _symbol_dtype(bits: int) -> np.dtype:
    return np.dtype(np.uint8 if bits <= 8 else np.uint16)


def _pack_bits(symbols: np.ndarray, bits: int) -> np.ndarray:
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


def _unpack_bits(data: np.ndarray, bits: int, n: int) -> np.ndarray:
    """Inverse of :func:`_pack_bits`; raises if padding bits are not zero."""
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
        cols = np.empty((groups, 8), dtype=np.uint16)
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


# Row b of _BYTE_SIGNS holds the 8 signs (+1 for bit 0, -1 for bit 1) of byte b
# in little-endian bit order, so one row gather decodes 8 entries.
_BYTE_SIGNS = np.where(
    np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little") == 1,
    np.float32(-1.0),
    np.float32(1.0),
)

_TOPK_SAMPLE = 1 << 16


def _topk_indices(magnitude: np.ndarray, k: int) -> np.ndarray:
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
    if d >= 4 * _TOPK_SAMPLE:
        sample = magnitude[:: d // _TOPK_SAMPLE]
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


def _randk_indices(d: int, k: int, seed: int) -> np.ndarray:
    """Sorted indices of the first ``k`` distinct draws of the PCG64 stream.

    Draw ``i`` maps the top 32 bits ``r`` of the raw 64-bit output to
    ``(r * d) >> 32`` (uniform up to a relative bias of ``d / 2**32``). Only the
    bit generator's raw stream is used, which numpy keeps stable across
    versions.
    """
    if k >= d:
        return np.arange(d, dtype=np.int64)
    bitgen = np.random.PCG64(seed)
    distinct = np.zeros(0, dtype=np.int64)
    while distinct.size < k:
        missing = k - distinct.size
        batch = int(missing * d / (d - distinct.size) * 1.05) + 64
        raw = bitgen.random_raw(batch).astype(_U64)
        draws = (((raw >> np.uint64(32)) * np.uint64(d)) >> np.uint64(32)).astype(np.int64)
        pool = np.concatenate([distinct, draws])
        _, first = np.unique(pool, return_index=True)
        first.sort()
        distinct = pool[first]
    chosen = distinct[:k]
    chosen.sort()
    return chosen


# --------------------------------------------------------------------------- #
# Payload reading
# --------------------------------------------------------------------------- #
class _Reader:
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


def _as_payload(payload: object) -> np.ndarray:
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


def _check_size(size: object) -> int:
    if isinstance(size, bool) or not isinstance(size, Integral):
        raise CodecError(f"size must be an int, got {type(size).__name__}")
    value = int(size)
    if not 0 <= value <= MAX_SIZE:
        raise CodecError(f"size must be in [0, {MAX_SIZE}], got {value}")
    return value


def _finite_values(values: np.ndarray, what: str) -> np.ndarray:
    if not np.isfinite(values).all():
        raise PayloadError(f"payload {what} contain NaN or inf")
    return values


# --------------------------------------------------------------------------- #
# Codecs
# --------------------------------------------------------------------------- #
def _header(codec_id: int, d: int) -> bytes:
    return _HEADER.pack(MAGIC, VERSION, codec_id, d)


def _join(*parts: bytes | np.ndarray) -> np.ndarray:
    arrays = [
        np.frombuffer(p, dtype=np.uint8) if isinstance(p, bytes) else p.view(np.uint8)
        for p in parts
    ]
    return np.concatenate(arrays)


def _encode_topk(v: np.ndarray, spec: CodecSpec) -> np.ndarray:
    d = v.size
    k = spec.k(d)
    magnitude = np.abs(v)
    if d and not math.isfinite(float(magnitude.max())):
        raise _non_finite("the vector")
    idx = _topk_indices(magnitude, k)
    values = _to_fp16(v[idx])
    gaps = np.diff(idx, prepend=0).astype(np.uint32)
    lengths = _varint_lengths(gaps)
    varint_bytes = int(lengths.sum(dtype=np.int64))
    bitmap_bytes = -(-d // 8)
    if varint_bytes <= bitmap_bytes:
        mode, section = _MODE_VARINT, _varint_encode(gaps, lengths)
    else:
        mask = np.zeros(d, dtype=bool)
        mask[idx] = True
        mode, section = _MODE_BITMAP, np.packbits(mask, bitorder="little")
    return _join(
        _header(spec.codec_id, d), _TOPK.pack(k, mode, section.size), section, values
    )


def _decode_topk(reader: _Reader, spec: CodecSpec, d: int) -> np.ndarray:
    k, mode, nbytes = reader.unpack(_TOPK, "top-k header")
    if k != spec.k(d):
        raise PayloadError(f"payload keeps k = {k} entries but {spec} of d = {d} keeps {spec.k(d)}")
    section = reader.take(nbytes, "index section")
    if mode == _MODE_VARINT:
        gaps = _varint_decode(section, k)
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
    values = reader.array(_F16, k, "top-k values").astype(np.float32)
    _finite_values(values, "top-k values")
    reader.finish()
    out = np.zeros(d, dtype=np.float32)
    out[idx] = values
    return out


def _encode_randk(v: np.ndarray, spec: CodecSpec, seed: int) -> np.ndarray:
    d = v.size
    k = spec.k(d)
    _check_finite(v)
    values = _to_fp16(v[_randk_indices(d, k, seed)])
    return _join(_header(spec.codec_id, d), _RANDK.pack(k, seed), values)


def _decode_randk(reader: _Reader, spec: CodecSpec, d: int, seed: int) -> np.ndarray:
    k, payload_seed = reader.unpack(_RANDK, "random-k header")
    if k != spec.k(d):
        raise PayloadError(f"payload keeps k = {k} entries but {spec} of d = {d} keeps {spec.k(d)}")
    if payload_seed != seed:
        raise PayloadError(
            f"payload was encoded with seed {payload_seed} but decode was given seed {seed}"
        )
    values = reader.array(_F16, k, "random-k values").astype(np.float32)
    _finite_values(values, "random-k values")
    reader.finish()
    out = np.zeros(d, dtype=np.float32)
    out[_randk_indices(d, k, seed)] = values
    return out


def _l2_norm(v: np.ndarray) -> float:
    norm = float(np.sqrt(np.dot(v, v)))
    if not math.isfinite(norm):  # float32 accumulation overflowed (or non-finite input)
        if not np.isfinite(v).all():
            raise _non_finite("the vector")
        peak = float(np.abs(v).max())
        scaled = v.astype(np.float64) / peak
        norm = peak * float(np.sqrt(np.dot(scaled, scaled)))
    return norm


def _encode_qsgd(v: np.ndarray, spec: CodecSpec, seed: int) -> np.ndarray:
    d = v.size
    s = int(spec.levels)  # type: ignore[arg-type]
    bits = (2 * s).bit_length()
    norm = _l2_norm(v) if d else 0.0
    norm32 = np.float32(norm)
    if not math.isfinite(float(norm32)):
        raise CodecError(f"cannot encode: l2 norm {norm!r} exceeds the float32 range")
    if float(norm32) < norm:  # round up so that |v_i| / norm <= 1 holds
        norm32 = np.nextafter(norm32, np.float32(np.inf))
    if norm32 > 0:
        level = np.abs(v)
        level *= np.float32(s / float(norm32))
        np.minimum(level, np.float32(s), out=level)
        floor = np.floor(level)
        level -= floor  # fractional part = probability of rounding up
        up = np.random.Generator(np.random.PCG64(seed)).random(d, dtype=np.float32) < level
        floor += up
        np.copysign(floor, v, out=floor)
        floor += np.float32(s)
        symbols = floor.astype(_symbol_dtype(bits))
    else:
        symbols = np.full(d, s, dtype=_symbol_dtype(bits))
    packed = _pack_bits(symbols, bits)
    return _join(_header(spec.codec_id, d), _QSGD.pack(s, float(norm32)), packed)


def _decode_qsgd(reader: _Reader, spec: CodecSpec, d: int) -> np.ndarray:
    s, norm = reader.unpack(_QSGD, "QSGD header")
    if s != spec.levels:
        raise PayloadError(f"payload was quantised with {s} levels but the spec is {spec}")
    if not (math.isfinite(norm) and norm >= 0.0):
        raise PayloadError(f"QSGD norm must be finite and >= 0, got {norm!r}")
    bits = (2 * s).bit_length()
    packed = reader.take(-(-d * bits // 8), "QSGD levels")
    reader.finish()
    table = ((np.arange(2 * s + 1, dtype=np.float64) - s) * (float(norm) / s)).astype(np.float32)
    if bits < 8 and 8 % bits == 0:
        # Decode whole bytes through a 256-row table (one row gather per byte).
        per_byte = 8 // bits
        byte_symbols = (np.arange(256)[:, None] >> (bits * np.arange(per_byte))) & ((1 << bits) - 1)
        if packed.size and (byte_symbols.max(axis=1) > 2 * s)[packed].any():
            raise PayloadError(f"QSGD level symbol out of range [0, {2 * s}]")
        tail = d % per_byte
        if tail and packed[-1] >> (bits * tail):
            raise PayloadError("non-zero padding bits after the last packed entry")
        byte_table = np.zeros(byte_symbols.shape, dtype=np.float32)
        valid = byte_symbols <= 2 * s
        byte_table[valid] = table[byte_symbols[valid]]
        return np.take(byte_table, packed, axis=0).reshape(-1)[:d]
    symbols = _unpack_bits(packed, bits, d)
    if d and int(symbols.max()) > 2 * s:
        raise PayloadError(f"QSGD level symbol {int(symbols.max())} out of range [0, {2 * s}]")
    return np.take(table, symbols)


def _encode_sign(v: np.ndarray, spec: CodecSpec) -> np.ndarray:
    d = v.size
    l1 = float(np.add.reduce(np.abs(v), dtype=np.float64)) if d else 0.0
    if not math.isfinite(l1):
        raise _non_finite("the vector")
    scale = l1 / d if d else 0.0
    signs = np.packbits(v < 0, bitorder="little")
    return _join(_header(spec.codec_id, d), _SIGN.pack(scale), signs)


def _decode_sign(reader: _Reader, d: int) -> np.ndarray:
    (scale,) = reader.unpack(_SIGN, "sign scale")
    if not (math.isfinite(scale) and scale >= 0.0):
        raise PayloadError(f"sign scale must be finite and >= 0, got {scale!r}")
    packed = reader.take(-(-d // 8), "sign bits")
    reader.finish()
    if d % 8 and packed[-1] >> (d % 8):
        raise PayloadError("non-zero padding bits after the last sign bit")
    table = _BYTE_SIGNS * np.float32(scale)
    return np.take(table, packed, axis=0).reshape(-1)[:d]


def encode(vec: np.ndarray, spec: str, seed: int = 0) -> np.ndarray:
    """Compress a 1-D update vector into one ``uint8`` payload.

    Parameters
    ----------
    vec : numpy.ndarray
        1-D numeric vector (converted to float32), e.g. ``flatten(delta)``;
        at most ``2**32 - 1`` entries; must be finite.
    spec : str
        Codec spec, see the module docstring and :func:`parse_spec`.
    seed : int, default 0
        Shared seed in ``[0, 2**64)``: selects the ``randk`` coordinates and
        drives the ``qsgd`` stochastic rounding; ignored by other codecs. Use a
        fresh one per round and site (:func:`derive_seed`).

    Returns
    -------
    numpy.ndarray
        The payload, 1-D ``uint8``.

    Raises
    ------
    CodecError
        On an invalid spec or seed, or a vector that is not 1-D, numeric or finite.
    """
    codec = parse_spec(spec)
    seed_i = _check_seed(seed)
    v = _as_vector(vec)
    d = v.size
    if codec.name == "none":
        _check_finite(v)
        return _join(_header(codec.codec_id, d), v.astype(_F32, copy=False))
    if codec.name == "fp16":
        lo, hi = _check_finite(v)
        return _join(_header(codec.codec_id, d), _to_fp16(v, lo, hi))
    if codec.name == "topk":
        return _encode_topk(v, codec)
    if codec.name == "randk":
        return _encode_randk(v, codec, seed_i)
    if codec.name == "qsgd":
        return _encode_qsgd(v, codec, seed_i)
    return _encode_sign(v, codec)


def decode(payload: np.ndarray, spec: str, size: int, seed: int = 0) -> np.ndarray:
    """Decompress a payload produced by :func:`encode` with the same spec.

    Parameters
    ----------
    payload : numpy.ndarray
        1-D ``uint8`` array (``bytes`` are accepted too).
    spec : str
        The codec spec the payload must have been encoded with.
    size : int
        The expected dense length ``d`` (the model's parameter count).
    seed : int, default 0
        The seed used to encode (needed by ``randk``; checked against the
        seed recorded in the payload).

    Returns
    -------
    numpy.ndarray
        A new float32 vector of length ``size``.

    Raises
    ------
    PayloadError
        If the payload is malformed or disagrees with ``spec``/``size``/``seed``:
        wrong magic, version or codec, wrong ``d`` or ``k``, truncated or
        trailing bytes, out-of-range or non-increasing indices, non-zero
        padding bits, out-of-range levels, non-finite values.
    CodecError
        On an invalid spec, size or seed argument.
    """
    codec = parse_spec(spec)
    d = _check_size(size)
    seed_i = _check_seed(seed)
    reader = _Reader(_as_payload(payload))
    magic, version, codec_id, payload_d = reader.unpack(_HEADER, "header")
    if magic != MAGIC:
        raise PayloadError(
            f"bad magic byte 0x{magic:02x} (expected 0x{MAGIC:02x}): not a codec payload"
        )
    if version != VERSION:
        raise PayloadError(f"unsupported payload format version {version} (expected {VERSION})")
    if codec_id != codec.codec_id:
        names = {v: k for k, v in CODEC_IDS.items()}
        raise PayloadError(
            f"payload codec is {names.get(codec_id, f'unknown id {codec_id}')!r} "
            f"but the spec is {str(codec)!r}"
        )
    if payload_d != d:
        raise PayloadError(f"payload encodes d = {payload_d} entries but size = {d} was expected")
    if codec.name in ("none", "fp16"):
        dtype = _F32 if codec.name == "none" else _F16
        values = reader.array(dtype, d, f"{dtype.name} values")
        reader.finish()
        return _finite_values(values.astype(np.float32), "values")
    if codec.name == "topk":
        return _decode_topk(reader, codec, d)
    if codec.name == "randk":
        return _decode_randk(reader, codec, d, seed_i)
    if codec.name == "qsgd":
        return _decode_qsgd(reader, codec, d)
    return _decode_sign(reader, d)


# --------------------------------------------------------------------------- #
# Error feedback
# --------------------------------------------------------------------------- #
class ErrorFeedback:
    r"""Error-feedback (memory) wrapper around a codec.

    Implements EF (Karimireddy et al. 2019 [3]_, EF-SGD; Stich et al. 2018
    [2]_, "memory"):

    .. math:: z = e + \delta, \quad p = \mathrm{encode}(z), \quad
              e \leftarrow z - \mathrm{decode}(p).

    The compression error is not lost but re-sent later, which makes biased
    compressors (top-k, sign) converge. Invariant: if the server applies
    ``x' <- x' - decode(p_t)`` while an uncompressed run applies
    ``x <- x - delta_t``, then ``x'_t - e_t = x_t`` at every step.

    Parameters
    ----------
    spec : str
        Codec spec (see :func:`parse_spec`).
    seed : int, default 0
        Default seed for :meth:`step`; pass a fresh ``seed`` per round to
        :meth:`step` for ``randk``/``qsgd``.

    Attributes
    ----------
    residual : numpy.ndarray
        The current error ``e`` (float32). Empty (zero entries) before the
        first step or :meth:`load_state`; its size is fixed by the first step.
    """

    def __init__(self, spec: str, seed: int = 0) -> None:
        self.spec: CodecSpec = parse_spec(spec)
        self.seed: int = _check_seed(seed)
        self.residual: np.ndarray = np.zeros(0, dtype=np.float32)
        self._sized = False

    def step(self, delta: np.ndarray, seed: int | None = None) -> np.ndarray:
        """Add the residual to ``delta``, encode it, keep the new residual.

        Parameters
        ----------
        delta : numpy.ndarray
            1-D update vector (``flatten`` of ``x_global - x_local``).
        seed : int or None
            Codec seed for this message (defaults to the constructor's seed);
            the server must decode with the same seed.

        Returns
        -------
        numpy.ndarray
            The ``uint8`` payload to send.

        Raises
        ------
        CodecError
            If ``delta`` is not a finite 1-D vector or its length differs from
            the residual's. The residual is unchanged on error.
        """
        v = _as_vector(delta)
        seed_i = self.seed if seed is None else _check_seed(seed)
        if not self._sized:
            residual = np.zeros(v.size, dtype=np.float32)
        elif v.size != self.residual.size:
            raise CodecError(
                f"update has {v.size} entries but the error-feedback residual has "
                f"{self.residual.size}; was the model changed?"
            )
        else:
            residual = self.residual
        z = residual + v
        payload = encode(z, self.spec, seed_i)
        z -= decode(payload, self.spec, z.size, seed_i)
        self.residual = z
        self._sized = True
        return payload

    def state(self) -> np.ndarray:
        """Return a copy of the residual, to persist between rounds."""
        return self.residual.copy()

    def load_state(self, residual: np.ndarray) -> None:
        """Restore a residual saved with :meth:`state`.

        An empty array resets the residual (the next step sets its size).

        Raises
        ------
        CodecError
            If ``residual`` is not a finite 1-D numeric array.
        """
        e = _as_vector(residual)
        if not np.isfinite(e).all():
            raise CodecError("residual contains NaN or inf")
        self.residual = e.copy()
        self._sized = e.size > 0

    def reset(self) -> None:
        """Forget the residual."""
        self.residual = np.zeros(0, dtype=np.float32)
        self._sized = False
