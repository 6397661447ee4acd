"""Codec specs (``"topk:0.01"``): the one place a spec string is parsed.

The name before the colon picks the codec in :data:`strategies.wire.codecs.registry.CODECS`;
that class parses the argument with one of the helpers below
(:func:`no_argument`, :func:`fraction_argument`, :func:`levels_argument`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from strategies.wire.codecs.errors import CodecError
from strategies.wire.codecs.registry import CODECS, names

__all__ = ["CodecSpec", "MAX_BUCKET", "MAX_LEVELS", "fraction_argument",
           "layer_fraction_argument", "levels_argument", "no_argument", "parse_spec"]

MAX_LEVELS = 32767  # keeps a signed level in 16 bits
MAX_BUCKET = 2**32 - 1  # a bucket never exceeds the longest vector


@dataclass(frozen=True)
class CodecSpec:
    """A parsed codec spec.

    Attributes
    ----------
    name : str
        A registered codec name (``none``, ``fp16``, ``topk``, ``randk``, ``qsgd``, ``sign``).
    fraction : float or None
        Kept fraction for ``topk`` / ``randk``.
    levels : int or None
        Number of quantisation levels ``s`` for ``qsgd``.
    bucket : int or None
        ``qsgd`` with one norm per bucket of this many entries (``qsgd:16:b512``,
        :mod:`strategies.wire.codecs.qsgd_buckets`); None: one norm for the whole vector.
    per_tensor : bool
        ``topk`` keeps ``k`` entries of every tensor instead of ``k`` over the
        whole vector (``topk:0.01:layer``, :mod:`strategies.wire.codecs.topk_layers`).
    segments : tuple of int or None
        The tensor sizes of the flattened vector, bound by :meth:`bind` when a
        message is encoded or decoded (not part of the spec string).
    """

    name: str
    fraction: float | None = None
    levels: int | None = None
    bucket: int | None = None
    per_tensor: bool = False
    segments: tuple[int, ...] | None = None

    @property
    def codec_id(self) -> int:
        """The codec id written in the payload header."""
        return CODECS.get(self.name).codec_id

    def k(self, d: int) -> int:
        """Number of kept entries of a ``d``-vector for ``topk`` / ``randk``.

        Per tensor: the sum over the bound segments of each one's ``k``.
        """
        if self.fraction is None:
            raise CodecError(f"codec {self.name!r} has no k")
        if self.per_tensor:
            return sum(self.segment_ks(d))
        return min(d, max(1, round(self.fraction * d)))

    def segment_ks(self, d: int) -> list[int]:
        """The ``k`` of each bound segment of a ``d``-vector (``topk:<f>:layer``)."""
        if self.segments is None or sum(self.segments) != d:
            raise CodecError(
                f"codec spec {str(self)!r} keeps k entries per tensor and needs the tensor "
                f"sizes of the {d} entries (encode/decode segments=...), got {self.segments}")
        whole = CodecSpec(self.name, fraction=self.fraction)
        return [whole.k(n) for n in self.segments]

    def bind(self, segments: Sequence[int] | None) -> CodecSpec:
        """This spec with the tensor sizes of its message's vector (kept by per-tensor specs)."""
        if not self.per_tensor or segments is None:
            return self
        return replace(self, segments=tuple(int(n) for n in segments))

    def __str__(self) -> str:
        if self.fraction is not None:
            return f"{self.name}:{self.fraction!r}" + (":layer" if self.per_tensor else "")
        if self.levels is not None:
            bucket = f":b{self.bucket}" if self.bucket is not None else ""
            return f"{self.name}:{self.levels}{bucket}"
        return self.name


def _spec_help() -> str:
    return "valid specs: " + ", ".join(CODECS.get(name).spec_help for name in names())


def no_argument(spec: str, name: str, sep: str, arg: str) -> CodecSpec:
    """Parse a spec whose codec takes no argument (``none``, ``fp16``, ``sign``)."""
    if sep:
        raise CodecError(f"codec spec {spec!r}: {name!r} takes no argument; {_spec_help()}")
    return CodecSpec(name)


def fraction_argument(spec: str, name: str, sep: str, arg: str) -> CodecSpec:
    """Parse ``<name>:<fraction>`` with ``0 < fraction <= 1`` (``randk``)."""
    try:
        fraction = float(arg)
    except ValueError:
        raise CodecError(
            f"codec spec {spec!r}: {name} needs a fraction, e.g. '{name}:0.01'; {_spec_help()}"
        ) from None
    if not (math.isfinite(fraction) and 0.0 < fraction <= 1.0):
        raise CodecError(f"codec spec {spec!r}: fraction must be in (0, 1], got {fraction!r}")
    return CodecSpec(name, fraction=fraction)


def layer_fraction_argument(spec: str, name: str, sep: str, arg: str) -> CodecSpec:
    """Parse ``<name>:<fraction>[:layer]`` (``topk``; ``:layer`` = ``k`` per tensor)."""
    fraction, option_sep, option = arg.partition(":")
    parsed = fraction_argument(spec, name, sep, fraction)
    if not option_sep:
        return parsed
    if option != "layer":
        raise CodecError(f"codec spec {spec!r}: the option after the fraction must be 'layer' "
                         f"(k per tensor), got {option!r}; {_spec_help()}")
    return replace(parsed, per_tensor=True)


def levels_argument(spec: str, name: str, sep: str, arg: str) -> CodecSpec:
    """Parse ``<name>:<levels>[:b<bucket>]`` with ``1 <= levels <= 32767`` (``qsgd``).

    ``:b<bucket>`` (``1 <= bucket <= 2**32 - 1``) sends one norm per bucket of
    ``bucket`` entries (:mod:`strategies.wire.codecs.qsgd_buckets`).
    """
    arg, bucket_sep, bucket = arg.partition(":")
    if bucket_sep and not re.fullmatch(r"b[0-9]+", bucket):
        raise CodecError(f"codec spec {spec!r}: the option after the levels must be "
                         f"'b<bucket size>', e.g. '{name}:16:b512'; {_spec_help()}")
    size = int(bucket[1:]) if bucket_sep else None
    if size is not None and not 1 <= size <= MAX_BUCKET:
        raise CodecError(f"codec spec {spec!r}: bucket must be in [1, {MAX_BUCKET}], got {size}")
    if not re.fullmatch(r"[0-9]+", arg):
        raise CodecError(
            f"codec spec {spec!r}: {name} needs an integer number of levels, "
            f"e.g. '{name}:16'; {_spec_help()}"
        )
    levels = int(arg)
    if not 1 <= levels <= MAX_LEVELS:
        raise CodecError(
            f"codec spec {spec!r}: levels must be in [1, {MAX_LEVELS}], got {levels}"
        )
    return CodecSpec(name, levels=levels, bucket=size)


@lru_cache(maxsize=64)
def _parse_spec_cached(spec: str) -> CodecSpec:
    name, sep, arg = spec.strip().lower().partition(":")
    codec = CODECS.find(name)
    if codec is None:
        raise CodecError(f"unknown codec spec {spec!r}; {_spec_help()}")
    return codec.parse_argument(spec, name, sep, arg)


def parse_spec(spec: str | CodecSpec) -> CodecSpec:
    """Parse and validate a codec spec string (case-insensitive).

    Parameters
    ----------
    spec : str or CodecSpec
        ``none``, ``fp16``, ``sign``, ``topk:<fraction>[:layer]``, ``randk:<fraction>``
        (``0 < fraction <= 1``) or ``qsgd:<levels>[:b<bucket>]``
        (``1 <= levels <= 32767``), or any other registered codec.

    Returns
    -------
    CodecSpec

    Raises
    ------
    CodecError
        If the spec is not a string or not one of the registered forms.
    """
    if isinstance(spec, CodecSpec):
        return spec
    if not isinstance(spec, str):
        raise CodecError(f"codec spec must be a str, got {type(spec).__name__}")
    return _parse_spec_cached(spec)
