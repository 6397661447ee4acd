"""Best-round selection on the same round's metric, early stopping, and their checkpoint
(issue 15, item 2)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from app.config.run_config import RunConfig, RunConfigError
from app.server_app import RoundRecorder
from app.tracking import BestRound
from strategies.rounds.checkpoint import (
    CHECKPOINT_FILE,
    ServerCheckpoint,
    load_checkpoint,
    run_folder,
    save_checkpoint,
)
from strategies.rounds.round_report import RoundReport


def _arrays(value: float) -> ArrayRecord:
    return ArrayRecord({"w": Array(np.full(3, value, np.float32)),
                        "n": Array(np.array(int(value * 10), np.int64))})


def _report(server_round: int, dice: float | None) -> RoundReport:
    evaluated = {} if dice is None else {"val-dice": dice, "val-loss": 1 - dice}
    sites = {} if dice is None else {"site-b": {"val-dice": dice}, "site-a": {"val-dice": dice}}
    return RoundReport(server_round, evaluate_aggregate=evaluated, evaluate=sites)


class _Tracker:
    run_id = federation = "fed"

    def __init__(self) -> None:
        self.recorded: list[int] = []

    def record(self, report: RoundReport) -> None:
        self.recorded.append(report.server_round)

    def flush(self) -> bool:
        return True


class _Strategy:
    def snapshot(self) -> dict:
        return {}


def _recorder(tmp_path, best: BestRound) -> RoundRecorder:
    path = run_folder(tmp_path, "fed") / CHECKPOINT_FILE
    return RoundRecorder(_Tracker(), _Strategy(), path, {}, lambda report: "progress", best)


def test_the_best_round_is_chosen_by_its_own_rounds_metric(tmp_path):
    """Round r's arrays are scored by round r's evaluation, not the previous round's."""
    best = BestRound("val-dice")
    recorder = _recorder(tmp_path, best)
    for server_round, dice in [(1, 0.2), (2, 0.7), (3, 0.5), (4, None)]:
        assert recorder(_report(server_round, dice), _arrays(server_round)) is False
    assert (best.round, best.value, best.sites) == (2, 0.7, ["site-a", "site-b"])
    np.testing.assert_array_equal(best.arrays[0], np.full(3, 2.0, np.float32))
    assert best.keys == ["w", "n"] and best.arrays[1] == 20


def test_the_checkpoint_keeps_the_best_round_for_a_resume(tmp_path):
    best = BestRound("val-dice", patience=3)
    recorder = _recorder(tmp_path, best)
    for server_round, dice in [(1, 0.6), (2, 0.4)]:
        recorder(_report(server_round, dice), _arrays(server_round))
    saved = load_checkpoint(run_folder(tmp_path, "fed") / CHECKPOINT_FILE, None)
    assert saved.server_round == 2
    resumed = BestRound("val-dice", patience=3)
    resumed.restore(saved.best)
    assert (resumed.round, resumed.value, resumed.sites, resumed.stale) == (
        1, 0.6, ["site-a", "site-b"], 1)
    np.testing.assert_array_equal(resumed.arrays[0], np.full(3, 1.0, np.float32))
    assert resumed.arrays[1].dtype == np.int64


def test_a_checkpoint_without_a_best_round_still_loads(tmp_path):
    path = run_folder(tmp_path, "fed") / CHECKPOINT_FILE
    save_checkpoint(path, ServerCheckpoint(server_round=1, keys=["w"], arrays=[np.zeros(2)],
                                           strategy={}, mlflow_run_id="fed"))
    best = BestRound("val-dice")
    best.restore(load_checkpoint(path, None).best)
    assert not best.found and best.value == -np.inf


def test_early_stopping_counts_evaluated_rounds_without_a_min_delta_gain(tmp_path):
    best = BestRound("val-dice", patience=2, min_delta=0.05)
    recorder = _recorder(tmp_path, best)
    # 0.52 is a new best (selected) but less than min-delta better: it does not reset patience
    stops = [recorder(_report(r, dice), _arrays(r))
             for r, dice in [(1, 0.5), (2, 0.52), (3, None), (4, 0.51)]]
    assert stops == [False, False, False, True]
    assert best.round == 2 and best.stale == 2


def test_patience_zero_never_stops():
    best = BestRound("val-dice")
    for server_round in range(1, 20):
        best.observe(server_round, {"val-dice": 0.1}, {}, ["w"], [np.zeros(1)])
    assert best.round == 1 and not best.exhausted


def test_early_stopping_run_config_keys():
    config = RunConfig.from_mapping({"early-stopping.patience": 3,
                                     "early-stopping.min-delta": 0.01,
                                     "initial-model": "/models/nlst.pt"})
    assert (config.early_stopping_patience, config.early_stopping_min_delta) == (3, 0.01)
    assert config.as_params()["early-stopping.patience"] == 3
    with pytest.raises(RunConfigError, match="'early-stopping.patience' needs fraction-evaluate"):
        RunConfig.from_mapping({"early-stopping.patience": 1, "fraction-evaluate": 0.0})
    with pytest.raises(RunConfigError, match="'early-stopping.min-delta' must be >= 0"):
        RunConfig.from_mapping({"early-stopping.min-delta": -0.1})


def test_a_round_scored_nan_is_never_the_best_round_even_from_a_checkpoint():
    """Issue 29, found 8: a NaN-scored best round (a checkpoint's) is not kept selected."""
    best = BestRound("val-dice")
    assert not best.observe(1, {"val-dice": float("nan")}, {"site-a": {}}, ["w"], [np.zeros(1)])
    assert not best.found
    best.restore({"metric": "val-dice", "round": 1, "value": float("nan"), "sites": ["site-a"],
                  "keys": ["w"], "arrays": [np.zeros(1)], "stale": 0})
    assert not best.found and best.value == -np.inf and best.arrays == []
    assert best.observe(2, {"val-dice": 0.3}, {"site-a": {}}, ["w"], [np.ones(1)])
    assert (best.round, best.value) == (2, 0.3)
