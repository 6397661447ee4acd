"""The strategy the ServerApp builds survives a checkpoint: every plug-in's state, no pickle."""

from __future__ import annotations

import numpy as np
import pytest

from app.config.run_config import RunConfig
from app.server_app import build_strategy
from strategies.rounds.checkpoint import (
    CHECKPOINT_FILE,
    ServerCheckpoint,
    load_checkpoint,
    run_folder,
    save_checkpoint,
)


@pytest.mark.parametrize("plugins", [
    {"strategy.aggregator": "fednova", "fednova.server-momentum": 0.9,
     "strategy.schedule": "adacomm", "strategy.selector": "rpow-d", "optimizer": "sgd"},
    {"strategy.aggregator": "fedavg", "strategy.schedule": "fixed",
     "strategy.selector": "uniform"},
])
def test_the_built_strategy_round_trips_onto_a_fresh_one(tmp_path, plugins):
    config = RunConfig.from_mapping({**plugins, "checkpoint-dir": str(tmp_path)})
    running = build_strategy(config, federation="fed")
    if plugins["strategy.selector"] == "uniform":
        running.selector.select(1, [3, 4, 5], None)
    running.sites.learn(3, "hospital-00", num_examples=40, loss=0.8)
    if plugins["strategy.aggregator"] == "fednova":
        running.aggregator.aggregator._velocity = [np.ones(2, np.float32)]  # behind norm-bound
        running.schedule.tau, running.schedule._initial = 3, 0.9
    path = run_folder(tmp_path, "fed") / CHECKPOINT_FILE
    save_checkpoint(path, ServerCheckpoint(server_round=2, keys=["w"], arrays=[np.zeros(2)],
                                           strategy=running.snapshot(), mlflow_run_id="fed",
                                           run_config=config.as_params()))
    resumed = build_strategy(config, federation="fed")
    loaded = load_checkpoint(path, {**config.as_params(), "resume": True},
                             template=resumed.snapshot())
    resumed.restore(loaded.strategy)
    assert resumed.sites == running.sites
    assert vars(resumed.selector).keys() == vars(running.selector).keys()
    assert resumed.selector.times_selected == running.selector.times_selected
    nodes = list(range(10))
    if plugins["strategy.selector"] == "uniform":  # same random state: the same next draw
        assert resumed.selector.select(2, nodes, None) == running.selector.select(2, nodes, None)
    if plugins["strategy.aggregator"] == "fednova":
        np.testing.assert_array_equal(resumed.aggregator.aggregator._velocity[0], np.ones(2))
        assert resumed.schedule.tau == 3 and resumed.schedule._initial == 0.9
