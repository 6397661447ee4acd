"""The model's Flower record (strategies.rounds.instructions): the packed downlink model,
one buffer and a layout, unpacked bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from strategies.rounds.instructions import pack_arrays, unpack_arrays
from strategies.wire.model_layout import LAYOUT_KEY, MODEL_KEY, PackedModelError


def _model() -> ArrayRecord:
    rng = np.random.default_rng(0)
    return ArrayRecord({
        "conv.weight": Array(rng.normal(size=(4, 1, 3, 3)).astype(np.float32)),
        "conv.bias": Array(rng.normal(size=4).astype(np.float32)),
        "bn.running_var": Array(np.ones(4, np.float64)),
        "bn.num_batches_tracked": Array(np.array(7, np.int64)),  # 0-d
        "head.weight": Array(rng.normal(size=(2, 4)).astype(np.float16)),
    })


def test_a_model_round_trips_bit_for_bit_with_names_order_and_dtypes():
    original = _model()
    packed = pack_arrays(original)
    assert list(packed.keys()) == [MODEL_KEY, LAYOUT_KEY]
    back = unpack_arrays(packed)
    assert list(back.keys()) == list(original.keys())
    for name, array in original.items():
        got = back[name].numpy()
        assert got.dtype == array.numpy().dtype and got.shape == array.numpy().shape, name
        assert got.tobytes() == array.numpy().tobytes(), name


def test_the_packed_model_is_two_arrays_whatever_the_tensor_count():
    many = ArrayRecord({f"t{i}": Array(np.full(3, i, np.float32)) for i in range(40)})
    packed = pack_arrays(many)
    assert len(packed) == 2
    assert packed[MODEL_KEY].numpy().nbytes == 40 * 3 * 4


def test_an_empty_model_round_trips():
    assert len(unpack_arrays(pack_arrays(ArrayRecord()))) == 0


def test_a_plain_array_record_is_refused_with_the_keys_it_has():
    with pytest.raises(PackedModelError, match="conv.weight"):
        unpack_arrays(_model())


def test_a_truncated_buffer_is_refused():
    packed = pack_arrays(_model())
    short = ArrayRecord({MODEL_KEY: Array(packed[MODEL_KEY].numpy()[:-4].copy()),
                         LAYOUT_KEY: packed[LAYOUT_KEY]})
    with pytest.raises(PackedModelError, match="layout does not match"):
        unpack_arrays(short)


def test_a_buffer_longer_than_its_layout_is_refused():
    packed = pack_arrays(_model())
    long = ArrayRecord({MODEL_KEY: Array(np.concatenate([packed[MODEL_KEY].numpy(),
                                                         np.zeros(8, np.uint8)])),
                        LAYOUT_KEY: packed[LAYOUT_KEY]})
    with pytest.raises(PackedModelError, match="holds"):
        unpack_arrays(long)
