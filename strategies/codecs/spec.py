"""Codec specs (``"topk:0.01"``): the one place a spec string is parsed.

The name before the colon picks the codec class in :mod:`strategies.codecs.registry`;
that class parses the argument with one of the helpers below
(:func:`no_argument`, :func:`fraction_argument`, :func:`levels_argument`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

from strategies.codecs import registry
from strategies.codecs.errors import CodecError

__all__ = ["CodecSpec", "MAX_LEVELS", "fraction_argument", "levels_argument", "no_argument",
           "parse_spec"]

MAX_LEVELS = 32767  # keeps a signed level in 16 bits


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
    """

    name: str
    fraction: float | None = None
    levels: int | None = None

    @property
    def codec_id(self) -> int:
        """The codec id written in the payload header."""
        return registry.codec(self.name).codec_id

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


def _spec_help() -> str:
    return "valid specs: " + ", ".join(c.spec_help for c in registry.codecs())


def no_argument(spec: str, name: str, sep: str, arg: str) -> CodecSpec:
    """Parse a spec whose codec takes no argument (``none``, ``fp16``, ``sign``)."""
    if sep:
        raise CodecError(f"codec spec {spec!r}: {name!r} takes no argument; {_spec_help()}")
    return CodecSpec(name)


def fraction_argument(spec: str, name: str, sep: str, arg: str) -> CodecSpec:
    """Parse ``<name>:<fraction>`` with ``0 < fraction <= 1`` (``topk``, ``randk``)."""
    try:
        fraction = float(arg)
    except ValueError:
        raise CodecError(
            f"codec spec {spec!r}: {name} needs a fraction, e.g. '{name}:0.01'; {_spec_help()}"
        ) from None
    if not (math.isfinite(fraction) and 0.0 < fraction <= 1.0):
        raise CodecError(f"codec spec {spec!r}: fraction must be in (0, 1], got {fraction!r}")
    return CodecSpec(name, fraction=fraction)


def levels_argument(spec: str, name: str, sep: str, arg: str) -> CodecSpec:
    """Parse ``<name>:<levels>`` with ``1 <= levels <= 32767`` (``qsgd``)."""
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
    return CodecSpec(name, levels=levels)


@lru_cache(maxsize=64)
def _parse_spec_cached(spec: str) -> CodecSpec:
    name, sep, arg = spec.strip().lower().partition(":")
    codec = registry.find(name)
    if codec is None:
        raise CodecError(f"unknown codec spec {spec!r}; {_spec_help()}")
    return codec.parse_argument(spec, name, sep, arg)


def parse_spec(spec: str | CodecSpec) -> CodecSpec:
    """Parse and validate a codec spec string (case-insensitive).

    Parameters
    ----------
    spec : str or CodecSpec
        ``none``, ``fp16``, ``sign``, ``topk:<fraction>``, ``randk:<fraction>``
        (``0 < fraction <= 1``) or ``qsgd:<levels>`` (``1 <= levels <= 32767``),
        or any other registered codec.

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
