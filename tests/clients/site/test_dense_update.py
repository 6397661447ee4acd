"""A site's default round writes its update dense, the codecs not entered (issue #45).

Under codec ``none`` the site writes the dense layout
(:func:`~strategies.wire.model_layout.pack_dense`) as the server reads it
(:func:`~strategies.wire.model_layout.dense_update`): no file of ``strategies/wire/codecs/``
nor ``update_codec.py`` is entered, and the bytes are those the identity codec writes
(:func:`~strategies.wire.update_codec.pack_update`), so the wire is unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest

from clients.site.instruction import Instruction
from clients.site.site_round import answer
from strategies.wire import message_keys as keys
from strategies.wire.codecs.errors import CodecError
from strategies.wire.model_layout import PAYLOAD_KEY, dense_update, pack_dense, unpack_model
from strategies.wire.update_codec import pack_update, unpack_update
from tests.clients.site_round_fixtures import packed_global, run_settings, site
from tests.fixtures.entered_files import entered_files

CODEC_FILES = ("strategies/wire/codecs/", "strategies/wire/update_codec.py")


def _train(tmp_path, tasks, server_round: int):
    run = run_settings()
    config = {keys.SERVER_ROUND: server_round, keys.CODEC_SEED: 7}
    instruction = Instruction.parse("train", config, run, "run-1")
    assert instruction.codec == "none"  # the default
    return answer(instruction, packed_global(), site(tmp_path), run, tasks)


def test_a_default_train_round_enters_no_file_of_the_codecs(tmp_path, tasks):
    _train(tmp_path, tasks, 1)  # imports, the task's data
    reply, entered = entered_files(lambda: _train(tmp_path, tasks, 2))
    assert {"clients/site/site_round.py", "strategies/wire/model_layout.py"} <= entered
    assert not sorted(f for f in entered if f.startswith(CODEC_FILES))
    reference = list(unpack_model(packed_global()).values())
    delta = dense_update(reply.update, reference)
    assert delta is not None
    raw = {int(key.removeprefix("raw-")) for key in reply.update if key != PAYLOAD_KEY}
    want = pack_update(delta, "none", 7, raw=raw)  # what the identity codec sends
    assert list(reply.update) == list(want)
    for key, array in want.items():
        assert reply.update[key].dtype == array.dtype and reply.update[key].shape == array.shape
        assert reply.update[key].tobytes() == array.tobytes(), key


def _delta() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=5),
            np.array(-2, np.int64), np.array([0.5, -0.25], np.float32), np.array(1.5, np.float32)]


@pytest.mark.parametrize("raw", [(), (3,), (0, 1, 3, 4)])
def test_the_dense_layout_is_the_identity_codec_s_bit_for_bit(raw):
    got, want = pack_dense(_delta(), 5, raw=raw), pack_update(_delta(), "none", 5, raw=raw)
    assert list(got) == list(want)
    for key, array in want.items():
        assert got[key].dtype == array.dtype and got[key].shape == array.shape
        assert got[key].tobytes() == array.tobytes(), key
    reference = _delta()  # the server reads it dense as the codec decodes it
    for a, b in zip(dense_update(got, reference), unpack_update(got, reference, "none"),
                    strict=True):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("delta, seed", [
    ([np.array([1.0, np.nan], np.float32)], 0),
    ([np.array([1e300])], 0),  # inf as float32
    ([np.zeros(2, np.float32)], -1),
    ([np.zeros(2, np.float32)], 2**64),
])
def test_the_dense_layout_refuses_what_the_identity_codec_refuses(delta, seed):
    with pytest.raises(CodecError) as codec:
        pack_update(delta, "none", seed)
    with pytest.raises(CodecError) as dense:
        pack_dense(delta, seed)
    assert str(dense.value) == str(codec.value)
