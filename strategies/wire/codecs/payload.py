"""Encode a vector into one payload and decode it back, dispatching on the registry.

:func:`decode` checks the common header (magic, version, codec id, ``d``)
against the ``spec`` and ``size`` it is given; each codec then checks its own
section (exact length, index order and range, bit padding, value finiteness)
and raises :class:`~strategies.wire.codecs.errors.PayloadError` on any mismatch.
A payload never contains a dense array of zeros.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from strategies.wire.codecs.errors import PayloadError
from strategies.wire.codecs.registry import CODECS, names_by_id
from strategies.wire.codecs.spec import CodecSpec, parse_spec
from strategies.wire.codecs.wire import (
    HEADER,
    MAGIC,
    VERSION,
    Reader,
    as_payload,
    as_vector,
    check_seed,
    check_size,
    header,
    join,
)

__all__ = ["decode", "encode"]


def encode(vec: np.ndarray, spec: str | CodecSpec, seed: int = 0,
           segments: Sequence[int] | None = None) -> np.ndarray:
    """Compress a 1-D update vector into one ``uint8`` payload.

    Parameters
    ----------
    vec : numpy.ndarray
        1-D numeric vector (converted to float32), e.g. ``flatten(delta)``;
        at most ``2**32 - 1`` entries; must be finite.
    spec : str
        Codec spec, see :func:`strategies.wire.codecs.spec.parse_spec`.
    seed : int, default 0
        Shared seed in ``[0, 2**64)``: selects the ``randk`` coordinates and
        drives the ``qsgd`` stochastic rounding; ignored by other codecs. Use a
        fresh one per round and site (:func:`strategies.wire.seeds.derive_seed`).
    segments : sequence of int, optional
        The sizes of the tensors ``vec`` is the concatenation of; needed by the
        per-tensor specs (``topk:<f>:layer``), ignored by the others.

    Returns
    -------
    numpy.ndarray
        The payload, 1-D ``uint8``.

    Raises
    ------
    CodecError
        On an invalid spec or seed, or a vector that is not 1-D, numeric or finite.
    """
    codec = parse_spec(spec).bind(segments)
    seed_i = check_seed(seed)
    v = as_vector(vec)
    sections = CODECS.get(codec.name).encode(v, codec, seed_i)
    return join(header(codec.codec_id, v.size), *sections)


def decode(payload: np.ndarray, spec: str | CodecSpec, size: int, seed: int = 0,
           segments: Sequence[int] | None = None) -> np.ndarray:
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
    segments : sequence of int, optional
        The tensor sizes the encoder was given (per-tensor specs only).

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
    codec = parse_spec(spec).bind(segments)
    d = check_size(size)
    seed_i = check_seed(seed)
    reader = Reader(as_payload(payload))
    magic, version, codec_id, payload_d = reader.unpack(HEADER, "header")
    if magic != MAGIC:
        raise PayloadError(
            f"bad magic byte 0x{magic:02x} (expected 0x{MAGIC:02x}): not a codec payload"
        )
    if version != VERSION:
        raise PayloadError(f"unsupported payload format version {version} (expected {VERSION})")
    if codec_id != codec.codec_id:
        name = names_by_id().get(codec_id, f"unknown id {codec_id}")
        raise PayloadError(f"payload codec is {name!r} but the spec is {str(codec)!r}")
    if payload_d != d:
        raise PayloadError(f"payload encodes d = {payload_d} entries but size = {d} was expected")
    return CODECS.get(codec.name).decode(reader, codec, d, seed_i)
