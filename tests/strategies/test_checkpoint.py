"""Server checkpoints: atomic, plug-in state kept, mismatched resumes refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from strategies.rounds.checkpoint import (
    CheckpointError,
    ServerCheckpoint,
    load_checkpoint,
    save_checkpoint,
)
from strategies.registry import SCHEDULES, SELECTORS

PLUGINS = {"aggregator": "fedavg", "schedule": "adacomm"}


def _checkpoint() -> ServerCheckpoint:
    schedule = SCHEDULES.create("adacomm", tau0=8, smoothing=0.0)
    schedule.tau = 3
    selector = SELECTORS.create("pow-d", m=1, d=2, seed=0)
    selector.times_selected = {5: 2}
    return ServerCheckpoint(server_round=4, keys=["w"], arrays=[np.arange(3.0)],
                            strategy={"schedule": schedule, "selector": selector},
                            mlflow_run_id="abc", plugins=PLUGINS)


def test_round_trip_keeps_model_and_plugin_state(tmp_path: Path):
    path = tmp_path / "ckpt" / "server.pkl"
    save_checkpoint(path, _checkpoint())
    loaded = load_checkpoint(path, PLUGINS)
    assert loaded.server_round == 4 and loaded.mlflow_run_id == "abc"
    np.testing.assert_array_equal(loaded.arrays[0], np.arange(3.0))
    assert loaded.strategy["schedule"].tau == 3
    assert loaded.strategy["selector"].times_selected == {5: 2}
    assert not list(path.parent.glob("*.tmp"))


def test_refuses_missing_corrupt_or_mismatched(tmp_path: Path):
    path = tmp_path / "server.pkl"
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(path, PLUGINS)
    path.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(path, PLUGINS)
    save_checkpoint(path, _checkpoint())
    with pytest.raises(CheckpointError, match="same strategy settings"):
        load_checkpoint(path, {"aggregator": "fednova", "schedule": "adacomm"})


def test_a_checkpoint_of_classes_that_moved_is_refused_not_crashed(tmp_path: Path):
    """A checkpoint pickled by a version whose classes lived elsewhere: a CheckpointError."""
    path = tmp_path / "server.pkl"
    save_checkpoint(path, _checkpoint())
    data = path.read_bytes().replace(b"strategies.rounds.checkpoint", b"strategies.gone_module_")
    path.write_bytes(data)
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(path, PLUGINS)
