"""Packing a site's update: one payload for the float part, raw integer buffers."""

from __future__ import annotations

import numpy as np
import pytest

from strategies.compression import ErrorFeedback, decode
from strategies.wire.update_codec import pack_update, unpack_update
from strategies.wire.model_layout import PAYLOAD_KEY, UpdateFormatError, dense_bytes

REFERENCE = [np.zeros((3, 4), np.float32), np.zeros(5, np.float32), np.array(0, np.int64)]


def _delta(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=5).astype(np.float32),
            np.array(-3, np.int64)]


def test_round_trip_keeps_shapes_dtypes_and_integer_buffers_exact():
    delta = _delta()
    packed = pack_update(delta, "none")
    assert set(packed) == {PAYLOAD_KEY, "raw-2"}
    assert packed[PAYLOAD_KEY].dtype == np.uint8
    out = unpack_update(packed, REFERENCE, "none")
    for got, want in zip(out, delta):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_topk_payload_is_the_compact_encoding():
    rng = np.random.default_rng(1)
    big = [rng.normal(size=100_000).astype(np.float32)]
    packed = pack_update(big, "topk:0.01")
    assert packed[PAYLOAD_KEY].nbytes < dense_bytes(big) / 100 * 1.7
    out = unpack_update(packed, [np.zeros(100_000, np.float32)], "topk:0.01")[0]
    assert np.count_nonzero(out) == 1000


@pytest.mark.parametrize("mutate, message", [
    (lambda p: p.pop("raw-2"), "do not match the global model"),
    (lambda p: p.update({"raw-9": np.zeros(1)}), "unexpected array"),
    (lambda p: p.update({"extra": np.zeros(1)}), "unexpected array"),
    (lambda p: p.update({"raw-2": np.array(1, np.int32)}), "expected int64"),
    (lambda p: p.update({PAYLOAD_KEY: p[PAYLOAD_KEY][:-3]}), "payload rejected"),
])
def test_malformed_updates_are_rejected(mutate, message):
    packed = pack_update(_delta(), "none")
    mutate(packed)
    with pytest.raises(UpdateFormatError, match=message):
        unpack_update(packed, REFERENCE, "none")


def test_wrong_codec_at_the_server_is_rejected():
    packed = pack_update(_delta(), "sign")
    with pytest.raises(UpdateFormatError, match="payload rejected"):
        unpack_update(packed, REFERENCE, "topk:0.5")


def test_error_feedback_through_packing_keeps_the_invariant():
    """Sum of what the server decoded + the site's residual == sum of the true updates."""
    feedback = ErrorFeedback("topk:0.1")
    sent = np.zeros(17, np.float64)
    true = np.zeros(17, np.float64)
    for step in range(6):
        delta = _delta(step)
        packed = pack_update(delta, "topk:0.1", seed=step, feedback=feedback)
        sent += decode(packed[PAYLOAD_KEY], "topk:0.1", 17, seed=step)
        true += np.concatenate([delta[0].ravel(), delta[1]])
    np.testing.assert_allclose(sent + feedback.residual, true, atol=1e-5)


def test_float_buffers_marked_raw_bypass_the_lossy_codec():
    """Normalisation statistics travel exactly; only the rest is compressed."""
    delta = _delta()
    packed = pack_update(delta, "topk:0.1", raw={1})
    assert set(packed) == {PAYLOAD_KEY, "raw-1", "raw-2"}
    out = unpack_update(packed, REFERENCE, "topk:0.1")
    np.testing.assert_array_equal(out[1], delta[1])
    assert np.count_nonzero(out[0]) == 1  # top-10% of the 12 remaining entries


def test_two_raw_buffers_both_arrive_exactly():
    reference = [np.zeros(6, np.float32), np.zeros(3, np.float32), np.zeros(2, np.float32)]
    delta = [np.arange(6, dtype=np.float32), np.ones(3, np.float32), np.full(2, 7, np.float32)]
    out = unpack_update(pack_update(delta, "sign", raw={1, 2}), reference, "sign")
    np.testing.assert_array_equal(out[1], delta[1])
    np.testing.assert_array_equal(out[2], delta[2])


@pytest.mark.parametrize("spec", ["topk:0.2:layer", "qsgd:4:b4"])
def test_statistics_stay_dense_and_counted_beside_the_new_codec_variants(spec):
    """The choice for normalisation statistics (issue #17): kept dense, outside the lossy
    payload (and outside the per-tensor segments), and in the dense baseline as float32."""
    delta = [np.arange(1, 13, dtype=np.float32).reshape(3, 4),
             np.full(5, 0.25, np.float32), np.array(-3, np.int64)]
    packed = pack_update(delta, spec, seed=2, raw={1})
    assert set(packed) == {PAYLOAD_KEY, "raw-1", "raw-2"}
    out = unpack_update(packed, REFERENCE, spec, seed=2)
    np.testing.assert_array_equal(out[1], delta[1])
    if spec.startswith("topk"):
        assert np.count_nonzero(out[0]) == 2  # round(0.2 * 12) of the one compressed tensor
    assert dense_bytes(REFERENCE) == 12 * 4 + 5 * 4 + 8
