"""Server checkpoints: per federation, no pickle, run config checked, plug-in state restored."""

from __future__ import annotations

import json
import os
import pickle
import stat
from pathlib import Path

import numpy as np
import pytest

from strategies.plugins.registries import (AGGREGATORS, DEFENCES, SCHEDULES, SELECTORS,
                                           SERVER_OPTIMIZERS)
from strategies.rounds.checkpoint import CHECKPOINT_FILE, CheckpointError, ServerCheckpoint
from strategies.rounds.checkpoint import find_checkpoint, load_checkpoint, run_folder
from strategies.rounds.checkpoint import safe_name, save_checkpoint
from strategies.rounds.checkpoint import StateTreeError, decode_tree, encode_tree
from strategies.rounds.update_stream import with_defence

CONFIG = {"task": "pe-seg", "strategy.aggregator": "fednova", "lr": 0.01, "resume": False}


def _plugins() -> dict:
    """Fresh plug-ins, as the run config builds them before a resume."""
    return {"aggregator": AGGREGATORS.create("fednova"),
            "server-opt": SERVER_OPTIMIZERS.create("avgm", momentum=0.5),
            "schedule": SCHEDULES.create("adacomm", tau0=8, smoothing=0.5),
            "selector": SELECTORS.create("pow-d", m=1, d=2, seed=0),
            "sizes": {}, "site_of": {}}


def _checkpoint(run_id: str = "abc", config: dict = CONFIG) -> ServerCheckpoint:
    state = _plugins()
    state["server-opt"].velocity = [np.full(3, 0.25), np.arange(2.0)]
    state["schedule"].tau = 3
    state["schedule"]._smoother.update(0.7)
    state["schedule"]._initial = 0.7
    state["selector"].times_selected = {5: 2, 7: 1}
    state["selector"]._rng.random(4)
    state["sizes"], state["site_of"] = {5: 120, 7: np.int64(30)}, {5: "hospital-00"}
    state["bound"] = {("hospital-00", 5), ("hospital-01", 7)}
    return ServerCheckpoint(server_round=4, keys=["w", "b"], arrays=[np.arange(3.0), np.ones(2)],
                            strategy=state, mlflow_run_id=run_id, run_config=dict(config))


def _save(tmp_path: Path, run_id: str = "abc", config: dict = CONFIG) -> Path:
    path = run_folder(tmp_path / "ckpt", run_id) / CHECKPOINT_FILE
    save_checkpoint(path, _checkpoint(run_id, config))
    return path


def test_round_trip_restores_plugin_state_onto_the_run_plugins(tmp_path: Path):
    path = _save(tmp_path)
    saved = _checkpoint()
    fresh = _plugins()
    loaded = load_checkpoint(path, {**CONFIG, "resume": True}, template=fresh)
    assert loaded.server_round == 4 and loaded.mlflow_run_id == "abc"
    assert loaded.keys == ["w", "b"]
    np.testing.assert_array_equal(loaded.arrays[0], np.arange(3.0))
    state = loaded.strategy
    assert state["server-opt"] is fresh["server-opt"]  # restored onto the run's object
    np.testing.assert_array_equal(state["server-opt"].velocity[0], np.full(3, 0.25))
    assert state["schedule"].tau == 3 and state["schedule"]._smoother.value == 0.7
    assert state["selector"].times_selected == {5: 2, 7: 1}
    assert state["sizes"] == {5: 120, 7: 30} and state["site_of"] == {5: "hospital-00"}
    assert state["bound"] == {("hospital-00", 5), ("hospital-01", 7)}
    # The random state continues where it was: the same next draws.
    np.testing.assert_array_equal(state["selector"]._rng.random(3),
                                  saved.strategy["selector"]._rng.random(3))
    assert not list(path.parent.glob("*.tmp"))


def test_a_pickled_checkpoint_is_refused_without_running_it(tmp_path: Path):
    """Found: the checkpoint was unpickled before any check (write access = code execution)."""
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    folder = run_folder(tmp_path / "ckpt", "abc")
    for name in (CHECKPOINT_FILE, "server-checkpoint.pkl"):
        (folder / name).write_bytes(pickle.dumps(Payload()))
        with pytest.raises(CheckpointError, match="unreadable"):
            load_checkpoint(folder / name, CONFIG)
    assert not marker.exists()


def test_federations_keep_separate_checkpoints_and_resume_finds_its_own(tmp_path: Path):
    """Found: every federation shared one checkpoint file and resume checked only plug-in names."""
    first = _save(tmp_path, "run1", CONFIG)
    other = {**CONFIG, "lr": 0.02}
    second = _save(tmp_path, "run2", other)
    assert first != second and first.is_file() and second.is_file()
    assert find_checkpoint(tmp_path / "ckpt", {**CONFIG, "resume": True}) == first
    # A resume may run more rounds than the federation was started with.
    assert find_checkpoint(tmp_path / "ckpt", {**CONFIG, "num-server-rounds": 9}) == first
    assert find_checkpoint(tmp_path / "ckpt", other) == second
    with pytest.raises(CheckpointError, match=r"lr: 0\.02 -> 0\.03"):
        find_checkpoint(tmp_path / "ckpt", {**CONFIG, "lr": 0.03})


def test_resume_refuses_another_run_config_naming_the_keys(tmp_path: Path):
    path = _save(tmp_path)
    changed = {**CONFIG, "lr": 0.1, "strategy.aggregator": "fedavg"}
    with pytest.raises(CheckpointError, match="another run config") as info:
        load_checkpoint(path, changed, template=_plugins())
    assert "strategy.aggregator: 'fednova' -> 'fedavg'" in str(info.value)
    assert "lr: 0.01 -> 0.1" in str(info.value)


def test_resume_refuses_a_checkpoint_in_another_federations_folder(tmp_path: Path):
    """The horizontal and the vertical resume both rely on this check (one place)."""
    path = run_folder(tmp_path / "ckpt", "other") / CHECKPOINT_FILE
    save_checkpoint(path, _checkpoint("abc"))
    with pytest.raises(CheckpointError, match="holds federation 'abc', not its folder's"):
        load_checkpoint(path, CONFIG, template=_plugins())
    assert load_checkpoint(path, None).mlflow_run_id == "abc"  # inspection reads it


def test_a_checkpoint_older_than_a_new_key_resumes_while_the_key_keeps_its_default(
        tmp_path: Path):
    """Found in review: a key added by a later version of the app made every older
    checkpoint "another run config" ('<unset>' -> its default), so an upgrade broke resume."""
    path = _save(tmp_path)  # CONFIG has no "personalisation.method"
    upgraded = {**CONFIG, "resume": True, "personalisation.method": "none"}
    defaults = {**CONFIG, "personalisation.method": "none"}
    with pytest.raises(CheckpointError, match="personalisation.method: '<unset>' -> 'none'"):
        find_checkpoint(tmp_path / "ckpt", upgraded)
    assert find_checkpoint(tmp_path / "ckpt", upgraded, defaults) == path
    assert load_checkpoint(path, upgraded, template=_plugins(), defaults=defaults).server_round
    # The new key set to something else than its default is another federation.
    with pytest.raises(CheckpointError, match="personalisation.method: 'none' -> 'fedbn'"):
        load_checkpoint(path, {**upgraded, "personalisation.method": "fedbn"},
                        template=_plugins(), defaults=defaults)


def test_refuses_missing_corrupt_and_misfit_state(tmp_path: Path):
    folder = run_folder(tmp_path / "ckpt", "abc")
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(folder / CHECKPOINT_FILE, CONFIG)
    with pytest.raises(CheckpointError, match="no checkpoint"):
        find_checkpoint(tmp_path / "empty", CONFIG)
    (folder / CHECKPOINT_FILE).write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(folder / CHECKPOINT_FILE, CONFIG)
    path = _save(tmp_path)
    fresh = _plugins()
    fresh["schedule"] = SCHEDULES.create("fixed", tau0=8)  # another class than the saved one
    with pytest.raises(CheckpointError, match=r"state\['schedule'\].*AdaCommSchedule"):
        load_checkpoint(path, CONFIG, template=fresh)


@pytest.mark.parametrize("name", ["..", ".", "...", "a/b", "", "../x", "a\\b"])
def test_dot_only_and_separator_names_are_refused(tmp_path: Path, name: str):
    """Found: a federation name of '..' escaped the state folder."""
    with pytest.raises(CheckpointError, match="cannot name a state folder"):
        run_folder(tmp_path / "ckpt", name)
    assert safe_name("3f2a-run_1.b", "federation") == "3f2a-run_1.b"


def test_run_folders_are_private_and_checked(tmp_path: Path):
    path = _save(tmp_path)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    os.chmod(path.parent, 0o755)
    with pytest.raises(CheckpointError, match="mode 0700"):
        load_checkpoint(path, CONFIG)
    os.chmod(path.parent, 0o700)
    assert load_checkpoint(path, CONFIG).server_round == 4


def test_a_class_that_moved_restores_from_a_checkpoint_under_its_former_name(tmp_path: Path):
    """The default defence's aggregator (DefendedAggregator, saved as
    strategies.plugins.defences.defended.DefendedAggregator before it moved into
    strategies.rounds.update_stream) resumes onto the run's object."""
    def defended():
        return with_defence(DEFENCES.create("norm-bound"), AGGREGATORS.create("fedavg"))

    saved = defended()
    saved.defence.history = [[1.5, 2.0]]
    tree, arrays = encode_tree({"aggregator": saved})
    node = tree["v"][0][1]
    assert node["type"] == "strategies.rounds.update_stream.DefendedAggregator"
    node["type"] = "strategies.plugins.defences.defended.DefendedAggregator"
    fresh = defended()
    restored = decode_tree(tree, arrays, {"aggregator": fresh})["aggregator"]
    assert restored is fresh and vars(restored.defence) == vars(saved.defence)
    node["type"] = "strategies.plugins.defences.elsewhere.DefendedAggregator"
    with pytest.raises(StateTreeError, match="elsewhere"):
        decode_tree(tree, arrays, {"aggregator": defended()})


def test_the_default_defence_resumes_from_a_checkpoint_of_the_split_robust_package(tmp_path: Path):
    """NormBound, the default defence's bound, was saved as
    strategies.robust.norm_bound.NormBound before strategies/robust/ became one module:
    a checkpoint written then (read on a resume of a federation started before the
    upgrade) restores onto the run's object, with its state."""
    def defended():
        return with_defence(DEFENCES.create("norm-bound"), AGGREGATORS.create("fedavg"))

    saved = defended()
    saved.defence.history = [[1.5, 2.0]]
    tree, arrays = encode_tree({"aggregator": saved})
    text = json.dumps(tree)
    assert '"strategies.robust.NormBound"' in text
    old = json.loads(text.replace('"strategies.robust.NormBound"',
                                  '"strategies.robust.norm_bound.NormBound"'))
    fresh = defended()
    restored = decode_tree(old, arrays, {"aggregator": fresh})["aggregator"]
    assert restored is fresh and vars(restored.defence) == vars(saved.defence)
