"""Tests for strategies.compression: spec parsing, the codecs, error feedback, flat vectors and seeds.

Malformed payloads and the encoder's input checks: test_codec_payload_checks.py."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from strategies.compression import (
    CodecError,
    CodecSpec,
    ErrorFeedback,
    PayloadError,
    decode,
    derive_seed,
    encode,
    flatten,
    parse_spec,
    unflatten,
)
from strategies.wire.errors import ConfigError
from tests.strategies.codec_cases import ALL_SPECS, HEADER, vector

# --------------------------------------------------------------------------- #
# Spec parsing
# --------------------------------------------------------------------------- #
def test_parse_spec() -> None:
    assert parse_spec("topk:0.01") == CodecSpec("topk", fraction=0.01)
    assert parse_spec(" QSGD:16 ") == CodecSpec("qsgd", levels=16)
    assert parse_spec("sign") == CodecSpec("sign")
    assert str(parse_spec("randk:0.5")) == "randk:0.5"
    assert parse_spec("topk:0.01").k(1_000_000) == 10_000
    assert parse_spec("topk:0.01").k(10) == 1  # k = max(1, round(f d))
    assert parse_spec("topk:1").k(7) == 7


@pytest.mark.parametrize(
    "spec", ["", "zip", "topk", "topk:", "topk:0", "topk:1.5", "topk:nan", "randk:-0.1", "qsgd", "qsgd:0", "qsgd:1.5", "qsgd:40000", "none:1", "sign:2"]
)
def test_parse_spec_rejects(spec: str) -> None:
    with pytest.raises(CodecError):
        parse_spec(spec)
    with pytest.raises(CodecError):
        encode(vector(4), spec)


def test_parse_spec_error_message_is_clear() -> None:
    with pytest.raises(CodecError, match="unknown codec spec 'zip'.*valid specs"):
        parse_spec("zip")
    with pytest.raises(CodecError, match=r"fraction must be in \(0, 1\]"):
        parse_spec("topk:2")
    with pytest.raises(CodecError, match="must be a str"):
        parse_spec(3)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- #
# Round trips
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("spec", ALL_SPECS)
@pytest.mark.parametrize("d", [0, 1, 3, 8, 9, 1001])
def test_every_codec_round_trips_shape_and_dtype(spec: str, d: int) -> None:
    v = vector(d, seed=d)
    payload = encode(v, spec, seed=11)
    assert payload.dtype == np.uint8 and payload.ndim == 1
    out = decode(payload, spec, d, seed=11)
    assert out.dtype == np.float32 and out.shape == (d,)
    assert np.isfinite(out).all()
    assert decode(payload.tobytes(), spec, d, seed=11).tolist() == out.tolist()  # bytes accepted


def test_none_is_exact() -> None:
    v = vector(1000)
    out = decode(encode(v, "none"), "none", 1000)
    assert np.array_equal(out, v)
    assert not np.shares_memory(out, v)
    assert decode(encode(v.astype(np.float64), "none"), "none", 1000).tolist() == v.tolist()


def test_fp16_within_half_precision_and_clips() -> None:
    v = vector(5000) * 10
    out = decode(encode(v, "fp16"), "fp16", v.size)
    np.testing.assert_allclose(out, v, rtol=2**-11, atol=2**-24)
    big = np.array([1e6, -1e6, 1.0], dtype=np.float32)
    assert decode(encode(big, "fp16"), "fp16", 3).tolist() == [65504.0, -65504.0, 1.0]


def test_topk_exact_on_kept_entries_and_zero_elsewhere() -> None:
    rng = np.random.default_rng(0)
    d = 2000
    # values exactly representable in fp16, distinct magnitudes
    signs = np.where(rng.random(d) < 0.5, -1.0, 1.0)
    v = (signs * (rng.permutation(d) + 1) / 8).astype(np.float32)
    out = decode(encode(v, "topk:0.05"), "topk:0.05", d)
    k = 100
    kept = np.flatnonzero(out)
    assert kept.size == k
    expected = np.sort(np.argsort(-np.abs(v), kind="stable")[:k])
    assert np.array_equal(kept, expected)
    assert np.array_equal(out[kept], v[kept])
    assert np.abs(out[kept]).min() >= np.abs(np.delete(v, kept)).max()


@pytest.mark.parametrize("d", [1 << 18, (1 << 20) + 3])
@pytest.mark.parametrize("layout", ["random", "big_on_sample_stride", "big_off_sample_stride", "constant"])
def test_topk_large_vectors_match_brute_force(d: int, layout: str) -> None:
    """The sampled-threshold pre-filter must give the exact top-k set."""
    rng = np.random.default_rng(1)
    stride = d // (1 << 16)
    v = rng.random(d).astype(np.float32) * 1e-3
    if layout == "big_on_sample_stride":  # the sample sees only large entries
        v[::stride] += 10 + rng.random(v[::stride].size).astype(np.float32)
    elif layout == "big_off_sample_stride":  # the sample sees only small entries
        v[1::stride] += 10 + rng.random(v[1::stride].size).astype(np.float32)
    elif layout == "constant":
        v[:] = 0.5
    spec = "topk:0.001"
    k = parse_spec(spec).k(d)
    out = decode(encode(v, spec), spec, d)
    kept = np.flatnonzero(out)
    assert kept.size == k
    kth = np.partition(np.abs(v), d - k)[d - k]
    assert np.abs(v[kept]).min() >= kth  # every kept entry is among the k largest
    assert np.count_nonzero(np.abs(v) > kth) <= k


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("fraction", [0.01, 0.1, 0.5])
def test_topk_contraction(seed: int, fraction: float) -> None:
    """||C(v) - v||^2 <= (1 - k/d) ||v||^2 (k-contraction, Stich et al. 2018)."""
    d = 3000
    v = vector(d, seed)
    spec = f"topk:{fraction}"
    k = parse_spec(spec).k(d)
    err = decode(encode(v, spec), spec, d).astype(np.float64) - v
    assert err @ err <= (1 - k / d) * float(v.astype(np.float64) @ v) * (1 + 1e-6)
    # equality case: equal magnitudes (exact in fp16)
    w = np.where(vector(d, seed + 100) < 0, -0.25, 0.25).astype(np.float32)
    err = decode(encode(w, spec), spec, d) - w
    assert float(err @ err) == pytest.approx((1 - k / d) * float(w @ w))


def test_topk_index_mode_is_the_smaller_one() -> None:
    v = vector(100_000)
    sparse = encode(v, "topk:0.01")
    dense = encode(v, "topk:0.5")
    mode_offset = HEADER + 4
    assert sparse[mode_offset] == 0  # varint gaps
    assert dense[mode_offset] == 1  # bitmap
    k = 50_000
    assert dense.size == HEADER + 9 + 100_000 // 8 + 2 * k
    varint_bytes = int(struct.unpack("<I", sparse[HEADER + 5 : HEADER + 9].tobytes())[0])
    assert varint_bytes < 100_000 // 8
    assert sparse.size == HEADER + 9 + varint_bytes + 2 * 1000


def test_randk_reproducible_from_seed_and_no_indices_sent() -> None:
    d, spec = 5000, "randk:0.02"
    v = vector(d)
    p1, p2 = encode(v, spec, seed=42), encode(v, spec, seed=42)
    assert np.array_equal(p1, p2)
    assert p1.size == HEADER + 12 + 2 * 100  # header + (k, seed) + k fp16 values, no indices
    out = decode(p1, spec, d, seed=42)
    kept = np.flatnonzero(out)
    assert kept.size == 100
    assert np.array_equal(out[kept], v[kept].astype(np.float16).astype(np.float32))  # unscaled
    other = np.flatnonzero(decode(encode(v, spec, seed=43), spec, d, seed=43))
    assert not np.array_equal(kept, other)
    with pytest.raises(PayloadError, match="seed 42 but decode was given seed 43"):
        decode(p1, spec, d, seed=43)


def test_randk_indices_are_uniform() -> None:
    d, spec, trials = 100, "randk:0.1", 2000
    counts = np.zeros(d)
    v = np.ones(d, dtype=np.float32)
    for seed in range(trials):
        counts += decode(encode(v, spec, seed=seed), spec, d, seed=seed)
    # each index kept with probability k/d = 0.1: mean 200, sd ~13.4
    assert np.abs(counts - 200).max() < 70


def test_qsgd_is_unbiased() -> None:
    v = vector(16, seed=3)
    norm = float(np.linalg.norm(v))
    s, trials = 2, 4000
    total = np.zeros(16)
    for seed in range(trials):
        total += decode(encode(v, f"qsgd:{s}", seed=seed), f"qsgd:{s}", 16)
    mean = total / trials
    # per-entry sd of one draw <= norm / (2 s); 5 sigma of the mean
    np.testing.assert_allclose(mean, v, atol=5 * norm / (2 * s) / np.sqrt(trials))


@pytest.mark.parametrize("s", [1, 3, 16, 127, 300])
def test_qsgd_values_on_the_two_neighbouring_levels(s: int) -> None:
    v = vector(999, seed=s)
    norm = np.float32(np.linalg.norm(v))
    out = decode(encode(v, f"qsgd:{s}", seed=5), f"qsgd:{s}", v.size)
    levels = out / norm * s
    np.testing.assert_allclose(levels, np.rint(levels), atol=1e-3)
    ratio = np.abs(v) / norm * s
    assert np.all(np.abs(levels) >= np.floor(ratio) - 1e-3)
    assert np.all(np.abs(levels) <= np.ceil(ratio) + 1e-3)
    assert np.all((np.sign(out) == np.sign(v)) | (out == 0))


def test_qsgd_payload_uses_fewest_bits() -> None:
    d = 1000
    for s, bits in [(1, 2), (3, 3), (4, 4), (16, 6), (127, 8), (128, 9), (300, 10)]:
        assert encode(vector(d), f"qsgd:{s}").size == HEADER + 8 + -(-d * bits // 8)


def test_sign_hand_value() -> None:
    out = decode(encode(np.array([0.5, -2.0, 1.0], dtype=np.float32), "sign"), "sign", 3)
    np.testing.assert_allclose(out, 3.5 / 3 * np.array([1, -1, 1]), rtol=1e-6)
    assert out[0] == pytest.approx(1.16667, abs=1e-5)
    zeros = decode(encode(np.array([0.0, -0.0, 3.0], dtype=np.float32), "sign"), "sign", 3)
    assert zeros.tolist() == [1.0, 1.0, 1.0]  # zeros map to +


def test_payload_sizes() -> None:
    d = 1_000_000
    v = vector(d)
    dense = 4 * d
    assert encode(v, "topk:0.01").size < 0.02 * dense
    assert encode(v, "sign").size == HEADER + 4 + d // 8
    assert encode(v, "none").size == HEADER + dense
    assert encode(v, "fp16").size == HEADER + 2 * d
    assert encode(v, "randk:0.01").size == HEADER + 12 + 2 * 10_000


def test_payload_never_contains_dense_zeros() -> None:
    v = np.zeros(100_000, dtype=np.float32)
    v[123] = 1.0
    assert encode(v, "topk:0.0001").size < 50


# --------------------------------------------------------------------------- #
# Error feedback
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("spec", ["topk:0.05", "sign", "randk:0.1", "qsgd:2", "none"])
def test_error_feedback_invariant(spec: str) -> None:
    """x'_t - e_t == x_t at every step (Karimireddy et al. 2019)."""
    d, steps = 500, 25
    rng = np.random.default_rng(0)
    x = rng.standard_normal(d)
    x_compressed = x.copy()
    ef = ErrorFeedback(spec, seed=3)
    assert ef.residual.size == 0
    scale = 0.0
    for t in range(steps):
        delta = (rng.standard_normal(d) * 0.1).astype(np.float32)
        seed = derive_seed(3, t)
        payload = ef.step(delta, seed=seed)
        x = x - delta
        sent = decode(payload, spec, d, seed=seed)
        x_compressed = x_compressed - sent
        # float32 rounding of z = e + delta and e = z - sent: a few ulps per step
        scale = max(scale, float(np.abs(sent).max()), float(np.abs(ef.residual).max()))
        tolerance = 4 * (t + 1) * float(np.finfo(np.float32).eps) * scale
        np.testing.assert_allclose(x_compressed - ef.residual, x, rtol=0, atol=tolerance)
    if spec == "none":
        assert not ef.residual.any()


def test_error_feedback_residual_is_the_compression_error() -> None:
    ef = ErrorFeedback("topk:0.34")
    v = np.array([3.0, -0.5, 0.25], dtype=np.float32)
    payload = ef.step(v)
    assert decode(payload, "topk:0.34", 3).tolist() == [3.0, 0.0, 0.0]
    assert ef.residual.tolist() == [0.0, -0.5, 0.25]
    payload = ef.step(np.zeros(3, np.float32))  # the residual is sent next
    assert decode(payload, "topk:0.34", 3).tolist() == [0.0, -0.5, 0.0]
    assert ef.residual.tolist() == [0.0, 0.0, 0.25]


def test_error_feedback_state_round_trip() -> None:
    rng = np.random.default_rng(1)
    deltas = [rng.standard_normal(300).astype(np.float32) for _ in range(6)]
    a = ErrorFeedback("sign")
    for delta in deltas[:3]:
        a.step(delta)
    saved = a.state()
    assert saved.dtype == np.float32 and not np.shares_memory(saved, a.residual)
    b = ErrorFeedback("sign")
    b.load_state(saved)
    for delta in deltas[3:]:
        assert np.array_equal(a.step(delta), b.step(delta))
    assert np.array_equal(a.residual, b.residual)


def test_error_feedback_validation() -> None:
    ef = ErrorFeedback("topk:0.1")
    ef.step(np.ones(10, np.float32))
    before = ef.state()
    with pytest.raises(CodecError, match="10"):
        ef.step(np.ones(11, np.float32))
    nan = np.ones(10, np.float32)
    nan[0] = np.nan
    with pytest.raises(CodecError, match="NaN or inf"):
        ef.step(nan)
    assert np.array_equal(ef.residual, before)  # unchanged on error
    with pytest.raises(CodecError, match="NaN or inf"):
        ef.load_state(nan)
    ef.reset()
    assert ef.residual.size == 0
    ef.step(np.ones(11, np.float32))
    with pytest.raises(CodecError):
        ErrorFeedback("topk")


# --------------------------------------------------------------------------- #
# Helpers
# --------------------------------------------------------------------------- #
def test_flatten_unflatten_round_trip() -> None:
    like = [
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.array(7, dtype=np.int64),
        np.linspace(-1, 1, 4, dtype=np.float16),
        np.zeros((0, 3), dtype=np.float32),
    ]
    vec = flatten(like)
    assert vec.dtype == np.float32 and vec.shape == (11,)
    back = unflatten(vec, like)
    for a, b in zip(like, back):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert np.array_equal(a, b)
    assert unflatten(vec + 0.4, like)[1] == 7  # integers are rounded
    assert flatten([]).shape == (0,)
    with pytest.raises(CodecError, match="does not match the 11 entries"):
        unflatten(vec[:-1], like)
    with pytest.raises(CodecError, match="float or integer"):
        flatten([np.array([True])])


def test_derive_seed() -> None:
    assert derive_seed(1, 2, 3) == derive_seed(1, 2, 3)
    assert len({derive_seed(1, r, n) for r in range(10) for n in range(10)}) == 100
    assert 0 <= derive_seed(0) < 2**64
    with pytest.raises(ConfigError, match="nonnegative ints"):
        derive_seed(1, -2)
