"""The site's downlink receive path: dense as before, steps onto the model on disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from app.config.run_config import RunConfig, RunConfigError
from clients.site.instruction import Instruction
from clients.site.policy import SitePolicy
from clients.site.site import Site
from clients.site.site_feature import round_features
from clients.site.site_round import received_model
from strategies.downlink import ServerDownlink
from strategies.rounds.instructions import named_arrays, pack_arrays
from strategies.wire import message_keys as keys
from strategies.wire.downlink_receive import DownlinkSyncError
from tests.clients.site_round_fixtures import run_settings

pytestmark = pytest.mark.usefixtures("server_identity")


def _model(shift: float) -> ArrayRecord:
    return ArrayRecord({"w": Array(np.linspace(0, 1, 500, dtype=np.float32) + shift),
                        "n": Array(np.array(int(shift * 10), np.int64))})


def _receive(arrays: ArrayRecord, config: dict, state_dir: Path):
    """What the site's train round receives: the message's arrays as numpy, its instruction."""
    instruction = Instruction.parse("train", {keys.SERVER_ROUND: 1, keys.FEDERATION: "fed-1",
                                              **config}, run_settings(), "run-1")
    site = Site("hospital-a", state_dir.parent / "data", state_dir, SitePolicy.permissive(),
                cache_decoded=False)
    features = round_features(instruction, site, run_settings())
    received = received_model(named_arrays(arrays), features)
    return received, {key: value for feature in features
                      for key, value in feature.metrics().items()}


def _send(server: ServerDownlink, server_round: int, model: ArrayRecord, state_dir: Path):
    down = server.prepare(server_round, model, [7])
    return _receive(down.arrays[7], down.headers[7].settings(), state_dir)


def test_without_downlink_entries_the_packed_model_as_sent(tmp_path: Path):
    received, metrics = _receive(pack_arrays(_model(0.0)), {}, tmp_path / "state")
    np.testing.assert_array_equal(received["w"], _model(0.0)["w"].numpy())
    assert metrics == {} and not (tmp_path / "state").exists()


def test_steps_onto_the_saved_model_and_resync_after_losing_it(tmp_path: Path):
    state_dir = tmp_path / "state"
    server = ServerDownlink("topk:0.2")
    for server_round in (1, 2, 3):
        received, metrics = _send(server, server_round, _model(0.1 * server_round), state_dir)
        assert metrics == {keys.DOWNLINK_VERSION: server_round}
        assert server.last.headers[7].dense == (server_round == 1)
        np.testing.assert_array_equal(received["w"], server.reference.arrays[0])
        server.acknowledge(7, float(server_round))
    assert int(received["n"]) == 3
    for saved in (state_dir / "fed-1").glob("last-global-*"):
        saved.unlink()  # the site lost its state dir
    with pytest.raises(DownlinkSyncError):
        _send(server, 4, _model(0.4), state_dir)
    received, _ = _send(server, 5, _model(0.5), state_dir)
    assert server.last.headers[7].dense
    np.testing.assert_array_equal(received["w"], _model(0.5)["w"].numpy())


def test_run_config_downlink_codec_default_and_refusal():
    assert RunConfig.from_mapping({}).strategy_downlink_codec == "none"
    assert RunConfig.from_mapping({"strategy.downlink-codec": "topk:0.01"}
                                  ).strategy_downlink_codec == "topk:0.01"
    with pytest.raises(RunConfigError, match="'strategy.downlink-codec' is not a valid"):
        RunConfig.from_mapping({"strategy.downlink-codec": "qsgd:16"})
