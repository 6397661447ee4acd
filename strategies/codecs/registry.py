"""The codec registry: codec name -> codec class.

A codec is a class with a ``name``, the ``codec_id`` byte written in the
payload header, a ``spec_help`` fragment, a ``parse_argument`` function (see
:mod:`strategies.codecs.spec`) and two static methods::

    encode(v, spec, seed) -> uint8 codec section (after the common header)
    decode(reader, spec, d, seed) -> float32 vector of length d

Adding a codec is one new module decorated with :func:`register` and one
import line in :mod:`strategies.codecs`.
"""

from __future__ import annotations

from typing import TypeVar

__all__ = ["codec", "codec_by_id", "codecs", "find", "names", "register"]

_BY_NAME: dict[str, type] = {}
_BY_ID: dict[int, type] = {}

C = TypeVar("C", bound=type)


def register(cls: C) -> C:
    """Class decorator: add a codec class under its ``name`` and ``codec_id``."""
    name, codec_id = cls.name, cls.codec_id  # type: ignore[attr-defined]
    if name in _BY_NAME or codec_id in _BY_ID:
        raise RuntimeError(f"codec {name!r} (id {codec_id}) is registered twice")
    _BY_NAME[name] = cls
    _BY_ID[codec_id] = cls
    return cls


def find(name: str) -> type | None:
    """The codec class registered as ``name``, or None."""
    return _BY_NAME.get(name)


def codec(name: str) -> type:
    """The codec class registered as ``name`` (KeyError if none)."""
    return _BY_NAME[name]


def codec_by_id(codec_id: int) -> type | None:
    """The codec class whose payload id is ``codec_id``, or None."""
    return _BY_ID.get(codec_id)


def codecs() -> list[type]:
    """All registered codec classes, in payload-id order."""
    return [_BY_ID[i] for i in sorted(_BY_ID)]


def names() -> list[str]:
    """All registered codec names, in payload-id order."""
    return [c.name for c in codecs()]  # type: ignore[attr-defined]
