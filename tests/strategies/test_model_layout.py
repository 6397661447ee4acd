"""The update's layout and the dense update read without the codecs (issue #45).

A reply of codec ``none`` is read straight from its payload, bit for bit what the codec's
decode gives, and no file of the codecs is entered; a payload the dense read cannot take
is left to the codec's decode, whose checks give the reason (unchanged).
"""

from __future__ import annotations

import numpy as np
import pytest

from strategies.compression import encode
from strategies.wire.model_layout import UpdateFormatError, dense_update
from strategies.wire.update_codec import pack_update, unpack_update
from strategies.wire.model_layout import PAYLOAD_KEY
from tests.fixtures.entered_files import entered_files

REFERENCE = [np.zeros((3, 4), np.float32), np.zeros(5, np.float64), np.array(0, np.int64),
             np.zeros(2, np.float32)]


def _delta() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=5),
            np.array(-2, np.int64), np.array([0.5, -0.25], np.float32)]


@pytest.mark.parametrize("raw", [(), (3,)])
def test_a_dense_update_is_read_as_its_codec_decodes_it(raw):
    packed = pack_update(_delta(), "none", raw=raw)
    got, want = dense_update(packed, REFERENCE), unpack_update(packed, REFERENCE, "none")
    assert got is not None
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def test_the_dense_read_enters_no_file_of_the_codecs():
    packed = pack_update(_delta(), "none")
    _, entered = entered_files(lambda: dense_update(packed, REFERENCE))
    assert entered == {"strategies/wire/model_layout.py"}


@pytest.mark.parametrize("payload, reason", [
    (lambda p: p[:-1], "truncated"),
    (lambda p: np.concatenate([p, np.zeros(4, np.uint8)]), "trailing"),
    (lambda p: encode(np.zeros(12 + 5 + 2, np.float32), "fp16"), "payload codec is 'fp16'"),
    (lambda p: np.concatenate([p[:7], np.full(76, 0xFF, np.uint8)]), "NaN or inf"),
    (lambda p: np.concatenate([p[:1], [9], p[2:]]).astype(np.uint8), "version 9"),
])
def test_a_payload_it_cannot_read_is_left_to_the_codec(payload, reason):
    packed = pack_update(_delta(), "none")
    packed[PAYLOAD_KEY] = payload(packed[PAYLOAD_KEY])
    assert dense_update(packed, REFERENCE) is None
    with pytest.raises(UpdateFormatError, match=reason):
        unpack_update(packed, REFERENCE, "none")


def test_a_layout_it_cannot_take_is_refused_as_the_codec_refuses_it():
    packed = pack_update(_delta(), "none")
    packed["raw-2"] = np.array(1, np.int32)
    with pytest.raises(UpdateFormatError, match="expected int64") as dense:
        dense_update(packed, REFERENCE)
    with pytest.raises(UpdateFormatError) as codec:
        unpack_update(packed, REFERENCE, "none")
    assert str(dense.value) == str(codec.value)
