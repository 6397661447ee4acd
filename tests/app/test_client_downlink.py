"""The ClientApp's downlink receive path: dense as before, steps onto the model on disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from app.client_app import _received_global
from app.config.run_config import RunConfig, RunConfigError
from app.config.site_config import SiteConfig
from strategies import message_keys as keys
from strategies.downlink import ServerDownlink
from strategies.downlink_receive import DownlinkSyncError
from strategies.model_packing import pack_arrays

pytestmark = pytest.mark.usefixtures("server_identity")

CONTEXT = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})


def _model(shift: float) -> ArrayRecord:
    return ArrayRecord({"w": Array(np.linspace(0, 1, 500, dtype=np.float32) + shift),
                        "n": Array(np.array(int(shift * 10), np.int64))})


def _message(arrays: ArrayRecord, config: dict) -> tuple[Message, ConfigRecord]:
    instruction = ConfigRecord({keys.SERVER_ROUND: 1, keys.FEDERATION: "fed-1", **config})
    return Message(RecordDict({keys.ARRAYS: arrays, keys.CONFIG: instruction}), dst_node_id=7,
                   message_type=MessageType.TRAIN), instruction


def _send(server: ServerDownlink, server_round: int, model: ArrayRecord, site: SiteConfig):
    down = server.prepare(server_round, model, [7])
    msg, instruction = _message(down.arrays[7], down.headers[7].settings())
    return _received_global(msg, instruction, site, CONTEXT)


def test_without_downlink_entries_the_packed_model_as_sent(tmp_path: Path):
    site = SiteConfig(name="h0", data_path=tmp_path, state_dir=tmp_path / "state")
    msg, instruction = _message(pack_arrays(_model(0.0)), {})
    received, metrics = _received_global(msg, instruction, site, CONTEXT)
    np.testing.assert_array_equal(received["w"].numpy(), _model(0.0)["w"].numpy())
    assert metrics == {} and not (tmp_path / "state").exists()


def test_steps_onto_the_saved_model_and_resync_after_losing_it(tmp_path: Path):
    site = SiteConfig(name="h0", data_path=tmp_path, state_dir=tmp_path / "state")
    server = ServerDownlink("topk:0.2")
    for server_round in (1, 2, 3):
        received, metrics = _send(server, server_round, _model(0.1 * server_round), site)
        assert metrics == {keys.DOWNLINK_VERSION: server_round}
        assert server.last.headers[7].dense == (server_round == 1)
        np.testing.assert_array_equal(received["w"].numpy(), server.reference.arrays[0])
        server.acknowledge(7, float(server_round))
    assert int(received["n"].numpy()) == 3
    for saved in (tmp_path / "state" / "fed-1").glob("last-global-*"):
        saved.unlink()  # the site lost its state dir
    with pytest.raises(DownlinkSyncError):
        _send(server, 4, _model(0.4), site)
    received, _ = _send(server, 5, _model(0.5), site)
    assert server.last.headers[7].dense
    np.testing.assert_array_equal(received["w"].numpy(), _model(0.5)["w"].numpy())


def test_run_config_downlink_codec_default_and_refusal():
    assert RunConfig.from_mapping({}).strategy_downlink_codec == "none"
    assert RunConfig.from_mapping({"strategy.downlink-codec": "topk:0.01"}
                                  ).strategy_downlink_codec == "topk:0.01"
    with pytest.raises(RunConfigError, match="'strategy.downlink-codec' is not a valid"):
        RunConfig.from_mapping({"strategy.downlink-codec": "qsgd:16"})
