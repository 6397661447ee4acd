"""Tests for the strategies.wire.codecs registry: the seam a new codec plugs into."""

from __future__ import annotations

import numpy as np
import pytest

from strategies.wire import codecs
from strategies.wire.codecs.registry import CODECS, Codec, names_by_id
from strategies.wire.codecs.spec import CodecSpec, levels_argument
from strategies.wire.codecs.wire import F32, Reader, check_finite
from strategies.wire.errors import ConfigError, ReplyError


#: The shipped codecs' payload ids: the wire format, so never renumbered (a new codec adds one).
PAYLOAD_IDS = {"none": 0, "fp16": 1, "topk": 2, "randk": 3, "qsgd": 4, "sign": 5}


def test_registry_lists_the_shipped_codecs_in_payload_id_order() -> None:
    by_id = names_by_id()
    assert {name: i for i, name in by_id.items() if name in PAYLOAD_IDS} == PAYLOAD_IDS
    assert codecs.names() == [by_id[i] for i in sorted(by_id)]


def test_error_branches() -> None:
    assert issubclass(codecs.CodecError, ConfigError)
    assert issubclass(codecs.PayloadError, ReplyError)
    assert not issubclass(codecs.PayloadError, codecs.CodecError)
    assert issubclass(codecs.CodecError, ValueError) and issubclass(codecs.PayloadError, ValueError)


def test_a_registered_codec_round_trips_through_encode_and_decode(monkeypatch) -> None:
    monkeypatch.setattr(CODECS, "_entries", CODECS.entries())
    codecs.spec._parse_spec_cached.cache_clear()

    def encode(v: np.ndarray, spec: CodecSpec, seed: int) -> tuple[np.ndarray, ...]:
        check_finite(v)
        return ((v / np.float32(spec.levels)).astype(F32),)

    def decode(reader: Reader, spec: CodecSpec, d: int, seed: int) -> np.ndarray:
        values = reader.array(F32, d, "scaled values")
        reader.finish()
        return values * np.float32(spec.levels)

    scale = CODECS.add(
        "scale", Codec(200, "'scale:<k>'", levels_argument, encode, decode, "Divide by k.")
    )

    try:
        v = np.arange(9, dtype=np.float32)
        assert "scale" in codecs.names()
        np.testing.assert_array_equal(codecs.decode(codecs.encode(v, "scale:4"), "scale:4", 9), v)
        with pytest.raises(codecs.CodecError, match="codec 'scale' registered twice"):
            CODECS.add("scale", scale)
    finally:
        codecs.spec._parse_spec_cached.cache_clear()


def test_a_codec_sharing_a_payload_id_or_wider_than_a_byte_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(CODECS, "_entries", CODECS.entries())
    none = CODECS.get("none")
    CODECS.add("copy", Codec(0, "'copy'", none.parse_argument, none.encode, none.decode, "x"))
    with pytest.raises(codecs.CodecError, match="share payload id 0"):
        codecs.names()
    with pytest.raises(codecs.CodecError, match="codec_id 256 is not one byte"):
        Codec(256, "'wide'", none.parse_argument, none.encode, none.decode, "x")


def test_an_unknown_codec_names_the_run_config_key_and_the_codecs() -> None:
    with pytest.raises(codecs.CodecError, match="'strategy.codec' must be one of \\[.*'fp16', "):
        CODECS.get("zip")
