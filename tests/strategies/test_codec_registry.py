"""Tests for the strategies.codecs registry: the seam a new codec plugs into."""

from __future__ import annotations

import numpy as np
import pytest

from strategies import codecs
from strategies.codecs import registry
from strategies.codecs.spec import CodecSpec, levels_argument
from strategies.codecs.wire import F32, Reader, check_finite
from strategies.errors import ConfigError, ReplyError


def test_registry_lists_the_six_codecs_in_payload_id_order() -> None:
    assert codecs.names() == ["none", "fp16", "topk", "randk", "qsgd", "sign"]
    assert [c.codec_id for c in registry.codecs()] == [0, 1, 2, 3, 4, 5]


def test_error_branches() -> None:
    assert issubclass(codecs.CodecError, ConfigError)
    assert issubclass(codecs.PayloadError, ReplyError)
    assert not issubclass(codecs.PayloadError, codecs.CodecError)
    assert issubclass(codecs.CodecError, ValueError) and issubclass(codecs.PayloadError, ValueError)


def test_a_registered_codec_round_trips_through_encode_and_decode(monkeypatch) -> None:
    monkeypatch.setattr(registry, "_BY_NAME", dict(registry._BY_NAME))
    monkeypatch.setattr(registry, "_BY_ID", dict(registry._BY_ID))
    codecs.spec._parse_spec_cached.cache_clear()

    def encode(v: np.ndarray, spec: CodecSpec, seed: int) -> tuple[np.ndarray, ...]:
        check_finite(v)
        return ((v / np.float32(spec.levels)).astype(F32),)

    def decode(reader: Reader, spec: CodecSpec, d: int, seed: int) -> np.ndarray:
        values = reader.array(F32, d, "scaled values")
        reader.finish()
        return values * np.float32(spec.levels)

    scale = registry.register(
        registry.Codec("scale", 200, "'scale:<k>'", levels_argument, encode, decode, "Divide by k.")
    )

    try:
        v = np.arange(9, dtype=np.float32)
        assert "scale" in codecs.names()
        np.testing.assert_array_equal(codecs.decode(codecs.encode(v, "scale:4"), "scale:4", 9), v)
        with pytest.raises(RuntimeError, match="registered twice"):
            registry.register(scale)
    finally:
        codecs.spec._parse_spec_cached.cache_clear()
