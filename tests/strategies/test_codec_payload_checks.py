"""Malformed codec payloads are refused (PayloadError), and so are bad encoder inputs (CodecError).

Payloads are cut, extended, hand-built (top-k with LEB128 gaps) or corrupted byte by byte;
the decoder must name what is wrong and never return a vector from a bad payload.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from strategies.compression import CodecError, PayloadError, decode, encode
from strategies.wire.codecs.varint import varint_decode, varint_encode, varint_lengths
from tests.strategies.codec_cases import ALL_SPECS, HEADER, vector


def leb128(value: int) -> bytes:
    """Reference unsigned LEB128 encoding of ``value``."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def topk_payload(d: int, indices: list[int], values: list[float], gaps: list[int] | None = None) -> np.ndarray:
    """Hand-built top-k payload with varint-coded gaps."""
    if gaps is None:
        gaps = [b - a for a, b in zip([0, *indices], indices)]
    section = b"".join(leb128(g) for g in gaps)
    raw = (
        struct.pack("<BBBI", 0xFC, 1, 2, d)
        + struct.pack("<IBI", len(indices), 0, len(section))
        + section
        + np.asarray(values, dtype="<f2").tobytes()
    )
    return np.frombuffer(raw, dtype=np.uint8).copy()


# --------------------------------------------------------------------------- #
# Malformed payloads
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("spec", ALL_SPECS)
def test_truncated_and_trailing_payloads_rejected(spec: str) -> None:
    v = vector(100)
    payload = encode(v, spec, seed=1)
    with pytest.raises(PayloadError):
        decode(payload[:-1], spec, 100, seed=1)
    with pytest.raises(PayloadError, match="truncated"):
        decode(payload[:5], spec, 100, seed=1)
    with pytest.raises(PayloadError, match="trailing"):
        decode(np.concatenate([payload, np.zeros(1, np.uint8)]), spec, 100, seed=1)


def test_header_mismatches_rejected() -> None:
    payload = encode(vector(100), "topk:0.1")
    bad = payload.copy()
    bad[0] = 0
    with pytest.raises(PayloadError, match="bad magic"):
        decode(bad, "topk:0.1", 100)
    bad = payload.copy()
    bad[1] = 9
    with pytest.raises(PayloadError, match="version 9"):
        decode(bad, "topk:0.1", 100)
    with pytest.raises(PayloadError, match="payload codec is 'topk' but the spec is 'sign'"):
        decode(payload, "sign", 100)
    with pytest.raises(PayloadError, match="d = 100 entries but size = 101"):
        decode(payload, "topk:0.1", 101)
    with pytest.raises(PayloadError, match="k = 10 entries but topk:0.2"):
        decode(payload, "topk:0.2", 100)
    with pytest.raises(PayloadError, match="quantised with 16 levels"):
        decode(encode(vector(100), "qsgd:16"), "qsgd:8", 100)
    with pytest.raises(PayloadError, match="1-D uint8"):
        decode(payload.astype(np.int16), "topk:0.1", 100)
    with pytest.raises(PayloadError, match="uint8 numpy array"):
        decode([1, 2, 3], "topk:0.1", 100)  # type: ignore[arg-type]


def test_hand_built_topk_payload_decodes() -> None:
    out = decode(topk_payload(300, [0, 5, 200], [1.0, -2.0, 0.5]), "topk:0.01", 300)
    expected = np.zeros(300, np.float32)
    expected[[0, 5, 200]] = [1.0, -2.0, 0.5]
    assert np.array_equal(out, expected)


@pytest.mark.parametrize(
    ("indices", "values", "gaps", "match"),
    [
        ([0, 5, 300], [1.0, 1.0, 1.0], None, "index 300 out of range"),
        ([0, 5, 5], [1.0, 1.0, 1.0], None, "not strictly increasing"),
        ([3, 1, 2], [1.0, 1.0, 1.0], [3, 2**32 - 1, 1], "out of range"),
        ([0, 5, 9], [1.0, float("nan"), 1.0], None, "NaN or inf"),
        ([0, 5, 9], [1.0, float("inf"), 1.0], None, "NaN or inf"),
    ],
)
def test_bad_topk_indices_and_values_rejected(indices, values, gaps, match) -> None:
    with pytest.raises(PayloadError, match=match):
        decode(topk_payload(300, indices, values, gaps), "topk:0.01", 300)


def test_bad_varints_rejected() -> None:
    header = struct.pack("<BBBI", 0xFC, 1, 2, 300)
    values = np.ones(3, "<f2").tobytes()

    def payload(section: bytes, k: int = 3) -> np.ndarray:
        raw = header + struct.pack("<IBI", k, 0, len(section)) + section + values
        return np.frombuffer(raw, np.uint8)

    with pytest.raises(PayloadError, match="overlong"):
        decode(payload(b"\x00\x81\x00\x01"), "topk:0.01", 300)
    with pytest.raises(PayloadError, match="ends inside a varint"):
        decode(payload(b"\x00\x01\x01\x81"), "topk:0.01", 300)
    with pytest.raises(PayloadError, match="holds 2 complete varints"):
        decode(payload(b"\x00\x81\x01"), "topk:0.01", 300)
    with pytest.raises(PayloadError, match="exceeds the 5-byte"):
        decode(payload(b"\x00\x01\x81\x81\x81\x81\x81\x01"), "topk:0.01", 300)
    with pytest.raises(PayloadError, match="exceeds 32 bits"):
        decode(payload(b"\x00\x01\x81\x81\x81\x81\x1f"), "topk:0.01", 300)
    raw = header + struct.pack("<IBI", 3, 7, 1) + b"\x00" + values
    with pytest.raises(PayloadError, match="unknown top-k index mode 7"):
        decode(np.frombuffer(raw, np.uint8), "topk:0.01", 300)


def test_bad_bitmaps_rejected() -> None:
    v = vector(100)
    payload = encode(v, "topk:0.5")
    bitmap_at = HEADER + 9
    bad = payload.copy()
    bad[bitmap_at + 12] |= 0x80  # bit 99 is the last real one; set padding bit 103
    with pytest.raises(PayloadError, match="padding bits"):
        decode(bad, "topk:0.5", 100)
    bad = payload.copy()
    bad[bitmap_at] ^= 0x01  # one more or one fewer marked entry
    with pytest.raises(PayloadError, match="bitmap marks"):
        decode(bad, "topk:0.5", 100)


def test_bad_sign_and_qsgd_payloads_rejected() -> None:
    sign = encode(vector(10), "sign")
    bad = sign.copy()
    bad[-1] |= 0x80  # padding bit of entry 15
    with pytest.raises(PayloadError, match="padding bits"):
        decode(bad, "sign", 10)
    bad = sign.copy()
    bad[HEADER : HEADER + 4] = np.frombuffer(struct.pack("<f", float("nan")), np.uint8)
    with pytest.raises(PayloadError, match="scale must be finite"):
        decode(bad, "sign", 10)

    for s in (1, 16, 127, 300):  # byte-table, generic, 8-bit and >8-bit paths
        q = encode(vector(16), f"qsgd:{s}")
        bad = q.copy()
        bad[HEADER + 8 :] = 0xFF  # all-ones symbols exceed 2s
        with pytest.raises(PayloadError, match="out of range|padding"):
            decode(bad, f"qsgd:{s}", 16)
        bad = q.copy()
        bad[HEADER + 4 : HEADER + 8] = np.frombuffer(struct.pack("<f", float("inf")), np.uint8)
        with pytest.raises(PayloadError, match="norm must be finite"):
            decode(bad, f"qsgd:{s}", 16)
    q = encode(vector(10), "qsgd:16")  # 10 * 6 bits = 7.5 bytes -> 4 padding bits
    bad = q.copy()
    bad[-1] |= 0x80
    with pytest.raises(PayloadError, match="padding bits"):
        decode(bad, "qsgd:16", 10)


def test_non_finite_dense_payloads_rejected() -> None:
    for spec, nan in [("none", np.float32("nan")), ("fp16", np.float16("inf"))]:
        payload = encode(vector(4), spec)
        values = payload[HEADER:].view(np.float32 if spec == "none" else np.float16).copy()
        values[2] = nan
        bad = np.concatenate([payload[:HEADER], values.view(np.uint8)])
        with pytest.raises(PayloadError, match="NaN or inf"):
            decode(bad, spec, 4)


# --------------------------------------------------------------------------- #
# Encoder input validation
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("spec", ALL_SPECS)
def test_encode_rejects_non_finite_vectors(spec: str) -> None:
    for bad in (np.nan, np.inf, -np.inf):
        v = vector(50)
        v[7] = bad
        with pytest.raises(CodecError, match="NaN or inf"):
            encode(v, spec)


def test_encode_rejects_bad_arguments() -> None:
    with pytest.raises(CodecError, match="1-D"):
        encode(np.zeros((2, 2), np.float32), "none")
    with pytest.raises(CodecError, match="numpy.ndarray"):
        encode([1.0, 2.0], "none")  # type: ignore[arg-type]
    with pytest.raises(CodecError, match="seed"):
        encode(vector(3), "randk:0.5", seed=-1)
    with pytest.raises(CodecError, match="size"):
        decode(encode(vector(3), "none"), "none", -3)


def test_varint_helpers_match_reference_leb128() -> None:
    values = np.array([0, 1, 127, 128, 300, 16383, 16384, 2**21 - 1, 2**21, 2**28, 2**32 - 1], dtype=np.uint32)
    lengths = varint_lengths(values)
    encoded = varint_encode(values, lengths)
    assert encoded.tobytes() == b"".join(leb128(int(x)) for x in values)
    assert varint_decode(encoded, values.size).tolist() == values.tolist()
    rng = np.random.default_rng(0)
    random = (rng.integers(0, 2**32, 5000, dtype=np.uint64) >> rng.integers(0, 32, 5000).astype(np.uint64)).astype(np.uint32)
    assert varint_decode(varint_encode(random, varint_lengths(random)), 5000).tolist() == random.tolist()
