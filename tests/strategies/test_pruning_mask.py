"""The pruning mask: compacted arrays, zeros at pruned coordinates, and its wire record."""

from __future__ import annotations

import json

import numpy as np
import pytest

from strategies.wire.pruning_mask import (MASK_BITS_KEY, MASK_LAYOUT_KEY, PruningError, apply_mask,
                                          compact, density, expand, kept_count, mask_record,
                                          masks_from_record)


def _model() -> dict[str, np.ndarray]:
    return {"conv.weight": np.arange(1, 13, dtype=np.float32).reshape(2, 2, 3),
            "conv.bias": np.array([0.5, -0.5], np.float16),
            "bn.num_batches_tracked": np.array(7, np.int64)}


MASKS = {"conv.weight": np.array([[[1, 0, 1], [0, 0, 1]], [[1, 1, 1], [0, 0, 0]]], bool),
         "conv.bias": np.array([True, False])}


def test_compact_keeps_the_kept_values_in_c_order_and_expand_inverts_it():
    model = _model()
    sent = compact(model, MASKS)
    assert list(sent) == list(model)
    np.testing.assert_array_equal(sent["conv.weight"], [1, 3, 6, 7, 8, 9])
    assert sent["conv.weight"].dtype == np.float32 and sent["conv.weight"].ndim == 1
    np.testing.assert_array_equal(sent["conv.bias"], np.array([0.5], np.float16))
    assert sent["bn.num_batches_tracked"] is model["bn.num_batches_tracked"]
    back = expand(sent, MASKS)
    assert list(back) == list(model)
    for name, array in apply_mask(model, MASKS).items():
        assert back[name].shape == array.shape and back[name].dtype == array.dtype
        np.testing.assert_array_equal(back[name], array)


def test_apply_mask_zeroes_the_pruned_coordinates_only():
    masked = apply_mask(_model(), MASKS)
    np.testing.assert_array_equal(masked["conv.weight"],
                                  [[[1, 0, 3], [0, 0, 6]], [[7, 8, 9], [0, 0, 0]]])
    np.testing.assert_array_equal(masked["conv.bias"], [0.5, 0.0])
    assert masked["conv.bias"].dtype == np.float16
    assert int(masked["bn.num_batches_tracked"]) == 7


def test_expand_refuses_a_compacted_array_of_the_wrong_size():
    with pytest.raises(PruningError, match="'conv.bias' has 2 values, its pruning mask keeps 1"):
        expand({"conv.bias": np.ones(2, np.float32)}, MASKS)


def test_a_mask_of_another_shape_is_refused_naming_the_array():
    with pytest.raises(PruningError, match="'conv.bias'"):
        compact({"conv.bias": np.ones(3)}, MASKS)


def test_kept_count_and_density():
    model = _model()
    # 6 of 12 conv weights, 1 of 2 biases, and the uncovered counter (1 coordinate).
    assert kept_count(model, MASKS) == 6 + 1 + 1
    assert kept_count({n: a.shape for n, a in model.items()}, MASKS) == 8
    assert density(MASKS) == pytest.approx(7 / 14)
    assert density({}) == 1.0


def test_the_mask_record_round_trips():
    record = mask_record(MASKS)
    assert set(record) == {MASK_BITS_KEY, MASK_LAYOUT_KEY}
    assert record[MASK_BITS_KEY].dtype == np.uint8 and record[MASK_BITS_KEY].size == 2  # 14 bits
    assert json.loads(record[MASK_LAYOUT_KEY].tobytes()) == [["conv.weight", [2, 2, 3]],
                                                            ["conv.bias", [2]]]
    back = masks_from_record(record)
    assert list(back) == list(MASKS)
    for name, mask in MASKS.items():
        assert back[name].dtype == bool
        np.testing.assert_array_equal(back[name], mask)
    assert masks_from_record(mask_record({})) == {}


def _layout(value: object) -> np.ndarray:
    return np.frombuffer(json.dumps(value).encode(), np.uint8)


@pytest.mark.parametrize(("change", "message"), [
    ({MASK_BITS_KEY: None}, "lacks entry 'pruning-bits'"),
    ({MASK_LAYOUT_KEY: None}, "lacks entry 'pruning-layout'"),
    ({MASK_LAYOUT_KEY: np.frombuffer(b"[[", np.uint8)}, "is no JSON"),
    ({MASK_LAYOUT_KEY: _layout({"a": 1})}, "list of \\[name, shape\\] pairs"),
    ({MASK_LAYOUT_KEY: _layout([["a", [-1]]])}, "list of \\[name, shape\\] pairs"),
    ({MASK_LAYOUT_KEY: _layout([["a", [7]], ["a", [7]]])}, "names an array twice"),
    ({MASK_LAYOUT_KEY: _layout([["a", [100]]])}, "has 2 bytes, the layout's 100 coordinates "
                                                 "need 13"),
    ({MASK_BITS_KEY: np.zeros(2, np.int16)}, "'pruning-bits' must be 1-D uint8"),
    ({MASK_LAYOUT_KEY: np.zeros((1, 2), np.uint8)}, "'pruning-layout' must be 1-D uint8"),
])
def test_a_malformed_record_is_refused_naming_the_entry(change, message):
    record = {**mask_record(MASKS), **change}
    record = {k: v for k, v in record.items() if v is not None}
    with pytest.raises(PruningError, match=message):
        masks_from_record(record)
