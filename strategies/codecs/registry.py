"""The codec registry: codec name -> codec class.

A codec is a :class:`Codec` record: its ``name``, the ``codec_id`` byte
written in the payload header, a ``spec_help`` fragment, a ``parse_argument``
function (see :mod:`strategies.codecs.spec`) and two functions::

    encode(v, spec, seed) -> the codec sections (after the common header)
    decode(reader, spec, d, seed) -> float32 vector of length d

Adding a codec is one new module ending in ``CODEC = register(Codec(...))``
and one import line in :mod:`strategies.codecs`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Codec", "codec", "codec_by_id", "codecs", "find", "names", "register"]


@dataclass(frozen=True)
class Codec:
    """One update codec: its names on the wire and in specs, and its two functions."""

    name: str
    codec_id: int
    spec_help: str
    parse_argument: Callable[..., Any]
    encode: Callable[..., tuple[Any, ...]]
    decode: Callable[..., Any]
    summary: str


_BY_NAME: dict[str, Codec] = {}
_BY_ID: dict[int, Codec] = {}


def register(codec: Codec) -> Codec:
    """Add ``codec`` under its ``name`` and ``codec_id`` (each must be new)."""
    if codec.name in _BY_NAME or codec.codec_id in _BY_ID:
        raise RuntimeError(f"codec {codec.name!r} (id {codec.codec_id}) is registered twice")
    if not 0 <= codec.codec_id <= 255:
        raise RuntimeError(f"codec {codec.name!r}: codec_id {codec.codec_id} is not one byte")
    _BY_NAME[codec.name] = codec
    _BY_ID[codec.codec_id] = codec
    return codec


def find(name: str) -> Codec | None:
    """The codec registered as ``name``, or None."""
    return _BY_NAME.get(name)


def codec(name: str) -> Codec:
    """The codec registered as ``name`` (KeyError if none)."""
    return _BY_NAME[name]


def codec_by_id(codec_id: int) -> Codec | None:
    """The codec whose payload id is ``codec_id``, or None."""
    return _BY_ID.get(codec_id)


def codecs() -> list[Codec]:
    """All registered codecs, in payload-id order."""
    return [_BY_ID[i] for i in sorted(_BY_ID)]


def names() -> list[str]:
    """All registered codec names, in payload-id order."""
    return [c.name for c in codecs()]
