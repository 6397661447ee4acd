"""The strategy the ServerApp builds survives a checkpoint: every plug-in's state, no pickle.

A checkpoint written before ``fednova.server-momentum`` was retired (#45) resumes when it
did not use it (0: its run config key and FedNova's neutral attributes are no difference),
and is refused naming the key and its replacement when it did."""

from __future__ import annotations

import numpy as np
import pytest

from app.config.run_config import RunConfig
from app.server_app import build_strategy
from strategies.rounds.checkpoint import (
    CHECKPOINT_FILE,
    CheckpointError,
    ServerCheckpoint,
    load_checkpoint,
    run_folder,
    save_checkpoint,
)


@pytest.mark.parametrize("plugins", [
    {"strategy.aggregator": "fednova", "strategy.server-opt": "avgm", "server-opt.momentum": 0.9,
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
        running.train.server_opt.velocity = [np.ones(2)]
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
        np.testing.assert_array_equal(resumed.train.server_opt.velocity[0], np.ones(2))
        assert resumed.schedule.tau == 3 and resumed.schedule._initial == 0.9


def _old_fednova_checkpoint(tmp_path, momentum: float):
    """A FedNova checkpoint as the version before #45 wrote it: ``fednova.server-momentum``
    in its run config, the momentum and its velocity on the aggregator (behind norm-bound)."""
    config = RunConfig.from_mapping({"strategy.aggregator": "fednova", "optimizer": "sgd",
                                     "checkpoint-dir": str(tmp_path)})
    running = build_strategy(config, federation="fed")
    old = running.aggregator.aggregator
    old.server_momentum, old._velocity = momentum, None if momentum == 0 else [np.ones(2)]
    path = run_folder(tmp_path, "fed") / CHECKPOINT_FILE
    saved = {**config.as_params(), "fednova.server-momentum": momentum}
    save_checkpoint(path, ServerCheckpoint(server_round=2, keys=["w"], arrays=[np.zeros(2)],
                                           strategy=running.snapshot(), mlflow_run_id="fed",
                                           run_config=saved))
    return config, path


def test_an_old_checkpoint_without_fednova_server_momentum_resumes(tmp_path):
    config, path = _old_fednova_checkpoint(tmp_path, 0.0)
    resumed = build_strategy(config, federation="fed")
    loaded = load_checkpoint(path, {**config.as_params(), "resume": True},
                             template=resumed.snapshot(), defaults=RunConfig().as_params())
    resumed.restore(loaded.strategy)
    assert vars(resumed.aggregator.aggregator) == {"min_steps_fraction": 0.5}


def test_an_old_checkpoint_with_fednova_server_momentum_is_refused_naming_it(tmp_path):
    config, path = _old_fednova_checkpoint(tmp_path, 0.9)
    with pytest.raises(CheckpointError, match="fednova.server-momentum: 0.9 -> '<unset>' "
                                              "\\(retired: .*strategy.server-opt = \"avgm\""):
        load_checkpoint(path, {**config.as_params(), "resume": True},
                        template=build_strategy(config, federation="fed").snapshot(),
                        defaults=RunConfig().as_params())
    with pytest.raises(CheckpointError,
                       match="attributes .'_velocity', 'server_momentum'. unknown"):
        load_checkpoint(path, None, template=build_strategy(config, federation="fed").snapshot())
