"""The site's error-feedback residual survives ClientApp re-creation and a SuperNode restart."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Context, RecordDict

from app.client_app import _encode_update
from app.config.site_config import SiteConfig
from clients.site.state_store import SiteStateStore
from strategies import message_keys as keys
from strategies.compression import decode
from strategies.update_codec import PAYLOAD_KEY


def _context(node_id: int = 7) -> Context:
    return Context(run_id=1, node_id=node_id, node_config={}, state=RecordDict(),
                   run_config={})


def _instruction(seed: int) -> ConfigRecord:
    return ConfigRecord({keys.CODEC: "topk:0.2", keys.ERROR_FEEDBACK: True,
                         keys.CODEC_SEED: seed, keys.FEDERATION: "fed-1"})


def test_residual_lives_in_context_state_and_on_disk(tmp_path: Path):
    site = SiteConfig(name="h0", data_path=tmp_path, state_dir=tmp_path / "state")
    rng = np.random.default_rng(0)
    deltas = [[rng.normal(size=20).astype(np.float32)] for _ in range(4)]
    context = _context()
    decoded = np.zeros(20)
    for step in range(2):
        arrays, norm = _encode_update(deltas[step], _instruction(step), site, context)
        decoded += decode(arrays[PAYLOAD_KEY], "topk:0.2", 20, seed=step)
        assert norm > 0
    on_disk = SiteStateStore(site.state_dir).load("fed-1", "ef-residual")
    in_memory = context.state["ef-residual:fed-1"].to_numpy_ndarrays()[0]
    np.testing.assert_array_equal(on_disk, in_memory)

    restarted = _context()  # a new SuperNode process: empty context.state
    for step in range(2, 4):
        arrays, _ = _encode_update(deltas[step], _instruction(step), site, restarted)
        decoded += decode(arrays[PAYLOAD_KEY], "topk:0.2", 20, seed=step)
    residual = SiteStateStore(site.state_dir).load("fed-1", "ef-residual")
    np.testing.assert_allclose(decoded + residual, np.sum([d[0] for d in deltas], axis=0),
                               atol=1e-5)


def test_other_federations_and_lossless_codecs_keep_no_residual(tmp_path: Path):
    site = SiteConfig(name="h0", data_path=tmp_path, state_dir=tmp_path / "state")
    delta = [np.ones(10, np.float32)]
    _, norm = _encode_update(delta, ConfigRecord({keys.CODEC: "none"}), site, _context())
    assert norm == 0.0 and not (tmp_path / "state").exists()
    _encode_update(delta, _instruction(0), site, _context())
    assert SiteStateStore(site.state_dir).load("fed-2", "ef-residual") is None
