"""The site's error-feedback residual survives a new process (its state store, on disk)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from clients.site.instruction import Instruction
from clients.site.state_store import SiteStateStore
from clients.site.site_feature import RESIDUAL_NAME
from clients.site.site_round import encode_update
from strategies.compression import decode
from strategies.wire import message_keys as keys
from strategies.wire.model_layout import PAYLOAD_KEY
from tests.clients.site_round_fixtures import run_settings


def _instruction(seed: int, codec: str = "topk:0.2", federation: str = "fed-1") -> Instruction:
    config = {keys.SERVER_ROUND: 1, keys.CODEC: codec, keys.ERROR_FEEDBACK: True,
              keys.CODEC_SEED: seed, keys.FEDERATION: federation}
    return Instruction.parse("train", config, run_settings(), "run-1")


def test_the_residual_carries_over_rounds_and_restarts(tmp_path: Path):
    state_dir = tmp_path / "state"
    rng = np.random.default_rng(0)
    deltas = [[rng.normal(size=20).astype(np.float32)] for _ in range(4)]
    decoded = np.zeros(20)
    for step in range(4):  # every round is a new process: the residual comes from the disk
        arrays, norm = encode_update(deltas[step], _instruction(step), state_dir)
        decoded += decode(arrays[PAYLOAD_KEY], "topk:0.2", 20, seed=step)
        assert norm > 0
        residual = SiteStateStore(state_dir).load("fed-1", RESIDUAL_NAME)
        assert norm == np.linalg.norm(residual)
    np.testing.assert_allclose(decoded + residual, np.sum([d[0] for d in deltas], axis=0),
                               atol=1e-5)


def test_other_federations_and_lossless_codecs_keep_no_residual(tmp_path: Path):
    state_dir = tmp_path / "state"
    delta = [np.ones(10, np.float32)]
    _, norm = encode_update(delta, _instruction(0, codec="none"), state_dir)
    assert norm == 0.0 and not state_dir.exists()
    encode_update(delta, _instruction(0), state_dir)
    assert SiteStateStore(state_dir).load("fed-2", RESIDUAL_NAME) is None
