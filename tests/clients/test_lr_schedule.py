"""The sites' learning rate over the rounds: cosine values, constant unchanged, used by training."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.config.run_config import RunConfig
from clients.site.instruction import Instruction, SiteRunSettings
from clients.site.site_round import SiteTasks, answer
from clients.training.trainer import select_device
from clients.training.lr_schedule import round_lr
from strategies.wire import message_keys as keys
from strategies.wire.errors import ConfigError
from tests.clients.site_round_fixtures import TinyCxr, packed_global, run_settings, site


def test_cosine_by_hand_at_rounds_1_half_and_last() -> None:
    lr, rounds, floor = 0.1, 10, 0.1
    low = floor * lr
    assert round_lr(lr, "cosine", 1, rounds, floor) == pytest.approx(0.1)
    # round R/2 + 1 is half way: (lr + eta_min) / 2
    assert round_lr(lr, "cosine", 6, rounds, floor) == pytest.approx((0.1 + 0.01) / 2)
    # round R/2: progress (5 - 1) / 10, cos(0.4 pi) = 0.30902
    assert round_lr(lr, "cosine", 5, rounds, floor) == pytest.approx(
        low + (lr - low) * (1 + 0.309017) / 2, rel=1e-5)
    # round R: progress 0.9, cos(0.9 pi) = -0.95106; above eta_min
    assert round_lr(lr, "cosine", 10, rounds, floor) == pytest.approx(
        low + (lr - low) * (1 - 0.951057) / 2, rel=1e-5)
    assert round_lr(lr, "cosine", 11, rounds, floor) == round_lr(lr, "cosine", 10, rounds, floor)
    rates = [round_lr(lr, "cosine", r, rounds) for r in range(1, rounds + 1)]
    assert all(a > b > 0 for a, b in zip(rates, rates[1:]))


def test_constant_is_lr_bit_for_bit_in_every_round() -> None:
    for server_round in (0, 1, 5, 6, 7):
        assert round_lr(0.003, "constant", server_round, 6, 0.5) == 0.003
    assert run_settings().round_lr(4) == run_settings().lr


def _update(tmp_path, run, server_round: int,
            arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    tasks = SiteTasks(lambda *args, **kwargs: TinyCxr(), select_device("cpu"))
    instruction = Instruction.parse("train", {keys.SERVER_ROUND: server_round,
                                              keys.LOCAL_STEPS: 4}, run, "run-1")
    return answer(instruction, arrays, site(tmp_path), run, tasks).update


def test_the_site_trains_with_its_rounds_rate(tmp_path, one_torch_thread) -> None:
    cosine = run_settings(lr_schedule="cosine", lr_floor=0.2, num_server_rounds=4)
    rate = cosine.round_lr(3)
    assert rate == pytest.approx(0.01 + 0.04 * (1 + math.cos(math.pi * 2 / 4)) / 2)
    arrays = packed_global()
    scheduled = _update(tmp_path / "a", cosine, 3, arrays)
    fixed = _update(tmp_path / "b", run_settings(lr=rate, num_server_rounds=4), 3, arrays)
    assert all(np.array_equal(scheduled[k], fixed[k]) for k in fixed)
    first = _update(tmp_path / "c", run_settings(num_server_rounds=4), 3, arrays)
    assert any(not np.array_equal(scheduled[k], first[k]) for k in first)


def test_the_keys_are_read_and_checked_naming_them() -> None:
    config = RunConfig.from_mapping({"lr-schedule": "cosine", "lr-floor": 0.1})
    assert (config.lr_schedule, config.lr_floor) == ("cosine", 0.1)
    assert RunConfig.from_mapping({}).lr_schedule == "constant"
    with pytest.raises(ConfigError, match="'lr-schedule' must be one of"):
        RunConfig.from_mapping({"lr-schedule": "step"})
    with pytest.raises(ConfigError, match="'lr-floor' must be in"):
        RunConfig.from_mapping({"lr-floor": 1.5})
    with pytest.raises(ConfigError, match="'lr-schedule' must be 'constant' with proximal-mu"):
        RunConfig.from_mapping({"lr-schedule": "cosine", "proximal-mu": 0.1,
                                "optimizer": "sgd", "momentum": 0.0})
    site_run = SiteRunSettings.from_run_config({"lr-schedule": "cosine", "lr-floor": 0})
    assert (site_run.lr_schedule, site_run.lr_floor) == ("cosine", 0.0)
    with pytest.raises(ConfigError, match="'lr-schedule' must be one of"):
        SiteRunSettings.from_run_config({"lr-schedule": "step"})
    with pytest.raises(ConfigError, match="'lr-floor' must be in"):
        SiteRunSettings.from_run_config({"lr-floor": -0.1})
