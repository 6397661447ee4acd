"""The codec registry: codec name -> codec, one :class:`~strategies.wire.registry.Registry`.

A codec meets :class:`UpdateCodec`: the ``codec_id`` byte written in the
payload header, a ``spec_help`` fragment, a ``summary``, a ``parse_argument``
function (see :mod:`strategies.wire.codecs.spec`) and two functions::

    encode(v, spec, seed) -> the codec sections (after the common header)
    decode(reader, spec, d, seed) -> float32 vector of length d

Adding a codec is one new module of ``strategies/wire/codecs/`` ending in
``CODEC = CODECS.add("<name>", Codec(...))``: :data:`CODECS` imports every module
of the package on its first lookup, so the file is all it takes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from strategies.wire.codecs.errors import CodecError
from strategies.wire.registry import Registry

if TYPE_CHECKING:
    from strategies.wire.codecs.spec import CodecSpec
    from strategies.wire.codecs.wire import Reader

__all__ = ["CODECS", "Codec", "UpdateCodec", "names", "names_by_id"]


@runtime_checkable
class UpdateCodec(Protocol):
    """An update codec: its payload id, its spec syntax and its two functions."""

    #: The byte written in the payload header (unique among the codecs).
    codec_id: int
    #: The spec form for error messages (``"'topk:<0<f<=1>[:layer]'"``).
    spec_help: str
    #: One line saying what it keeps.
    summary: str

    def parse_argument(self, spec: str, name: str, sep: str, arg: str) -> CodecSpec:
        """The :class:`CodecSpec` of ``spec`` = ``name + sep + arg``; ``CodecError`` if bad."""

    def encode(self, v: np.ndarray, spec: CodecSpec, seed: int) -> tuple[np.ndarray, ...]:
        """The codec sections of the finite float32 vector ``v`` (after the common header)."""

    def decode(self, reader: Reader, spec: CodecSpec, d: int, seed: int) -> np.ndarray:
        """The float32 vector of length ``d`` read from ``reader``; ``PayloadError`` if bad."""


@dataclass(frozen=True)
class Codec:
    """An :class:`UpdateCodec` made of a codec module's functions."""

    codec_id: int
    spec_help: str
    parse_argument: Callable[..., Any]
    encode: Callable[..., tuple[Any, ...]]
    decode: Callable[..., Any]
    summary: str

    def __post_init__(self) -> None:
        if not 0 <= self.codec_id <= 255:
            raise CodecError(f"codec {self.spec_help}: codec_id {self.codec_id} is not one byte")


#: Every codec by name (``strategy.codec``'s spec starts with one of them).
CODECS: Registry[UpdateCodec] = Registry("codec", "strategy.codec",
                                         package="strategies.wire.codecs", error=CodecError)


def names_by_id() -> dict[int, str]:
    """Codec name by payload id, in id order.

    Raises
    ------
    CodecError
        If two codecs share a payload id.
    """
    found: dict[int, str] = {}
    for name, codec in CODECS.entries().items():
        other = found.setdefault(codec.codec_id, name)
        if other != name:
            raise CodecError(f"codecs {other!r} and {name!r} share payload id {codec.codec_id}")
    return dict(sorted(found.items()))


def names() -> list[str]:
    """All registered codec names, in payload-id order."""
    return list(names_by_id().values())
