"""Per-tensor top-k (``topk:<f>:layer``): k entries of every tensor, the top-k wire format."""

from __future__ import annotations

import numpy as np
import pytest

from strategies.compression import CodecError
from strategies.compression import ErrorFeedback
from strategies.compression import PayloadError
from strategies.compression import decode
from strategies.compression import encode
from strategies.compression import parse_spec
from strategies.wire.update_codec import pack_update, unpack_update

# Two tensors: a large one and a small one whose entries are all smaller.
V = np.array([10.0, 9.0, 8.0, 7.0, 0.1, 0.2], dtype=np.float32)
SEGMENTS = [4, 2]


def test_the_spec_keeps_k_per_bound_tensor() -> None:
    spec = parse_spec("topk:0.25:layer")
    assert (spec.per_tensor, str(spec)) == (True, "topk:0.25:layer")
    # k_l = max(1, round(0.25 d_l)): 1 of 4 and max(1, round(0.5)) = 1 of 2
    assert spec.bind(SEGMENTS).segment_ks(6) == [1, 1]
    assert parse_spec("topk:0.25").k(6) == 2  # round(1.5) = 2 over the whole vector
    with pytest.raises(CodecError, match="option after the fraction must be 'layer'"):
        parse_spec("topk:0.25:tensor")
    with pytest.raises(CodecError, match="tensor sizes"):
        encode(V, "topk:0.25:layer")


def test_every_tensor_sends_its_largest_entry_where_global_topk_sends_none_of_the_small() -> None:
    layered = decode(encode(V, "topk:0.25:layer", segments=SEGMENTS), "topk:0.25:layer", 6,
                     segments=SEGMENTS)
    np.testing.assert_array_equal(layered, np.array([10, 0, 0, 0, 0, 0.2], dtype=np.float32)
                                  .astype(np.float16).astype(np.float32))
    whole = decode(encode(V, "topk:0.25"), "topk:0.25", 6)
    assert not whole[4:].any()


def test_the_wire_format_and_bytes_are_those_of_topk_with_the_same_k() -> None:
    # header 7 + (uint32 k, uint8 mode, uint32 n) 9 + bitmap of 6 bits (1 byte, fewer
    # than the varint gaps 0, 5) + 2 fp16 values
    payload = encode(V, "topk:0.25:layer", segments=SEGMENTS)
    assert payload.size == 7 + 9 + 1 + 4
    assert payload[16] == 0b100001
    # The same bytes decode as global top-k with k = 2 (topk:0.3 of 6: round(1.8) = 2).
    np.testing.assert_array_equal(decode(payload, "topk:0.3", 6),
                                  decode(payload, "topk:0.25:layer", 6, segments=SEGMENTS))


def test_a_payload_whose_indices_miss_a_tensor_is_rejected() -> None:
    # global top-2 puts both indices in tensor 0: same k, wrong split per tensor
    with pytest.raises(PayloadError, match="tensor 0 holds 2 indices, topk:0.25:layer keeps 1"):
        decode(encode(V, "topk:0.3"), "topk:0.25:layer", 6, segments=SEGMENTS)


def test_pack_and_unpack_bind_the_model_tensors_and_error_feedback_keeps_the_rest() -> None:
    rng = np.random.default_rng(0)
    delta = [rng.standard_normal((8, 3)).astype(np.float32), 1e-3 * np.ones(5, np.float32),
             np.array(7, dtype=np.int64)]
    feedback = ErrorFeedback("topk:0.1:layer")
    arrays = pack_update(delta, "topk:0.1:layer", seed=0, feedback=feedback)
    out = unpack_update(arrays, delta, "topk:0.1:layer", seed=0)
    assert np.count_nonzero(out[0]) == 2 and np.count_nonzero(out[1]) == 1  # round(2.4), max(1, 0)
    sent = np.concatenate([out[0].ravel(), out[1]])
    np.testing.assert_allclose(sent + feedback.residual,
                               np.concatenate([delta[0].ravel(), delta[1]]), atol=1e-3)
    assert out[2] == 7
