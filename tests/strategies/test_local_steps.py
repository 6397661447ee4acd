"""Tests for strategies.local_steps: AdaComm tau and the loss smoother."""

from __future__ import annotations

import math

import pytest

from strategies.local_steps import LocalStepsError, LossSmoother, adacomm_tau


@pytest.mark.parametrize(
    ("loss", "initial", "tau0", "expected"),
    [
        (0.25, 1.0, 8, 4),  # sqrt(1/4) * 8
        (1.0, 1.0, 8, 8),
        (0.5, 1.0, 8, 6),  # ceil(5.657)
        (4.0, 1.0, 3, 6),  # loss went up: more local steps
        (0.01, 1.0, 30, 3),  # sqrt(0.01) * 30 = 3.0000000000000004 in floats, still 3
        (2.5, 10.0, 10, 5),
    ],
)
def test_adacomm_hand_values(loss: float, initial: float, tau0: int, expected: int) -> None:
    assert adacomm_tau(loss, initial, tau0) == expected


def test_adacomm_clamps() -> None:
    assert adacomm_tau(1e-6, 1.0, 8) == 1  # ceil(0.008) = 1
    assert adacomm_tau(0.0, 1.0, 8, tau_min=2) == 2
    assert adacomm_tau(0.01, 1.0, 8, tau_min=3) == 3
    assert adacomm_tau(9.0, 1.0, 8, tau_max=10) == 10
    assert adacomm_tau(0.25, 1.0, 8, tau_min=2, tau_max=10) == 4


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((float("nan"), 1.0, 8), {}, "loss must be finite"),
        ((1.0, float("inf"), 8), {}, "initial_loss must be finite"),
        ((-0.1, 1.0, 8), {}, "loss must be >= 0"),
        ((1.0, 0.0, 8), {}, "initial_loss must be > 0"),
        ((1.0, 1.0, 0), {}, "tau0 must be >= 1"),
        ((1.0, 1.0, 2.5), {}, "tau0 must be an int"),
        ((1.0, 1.0, 8), {"tau_min": 0}, "tau_min must be >= 1"),
        ((1.0, 1.0, 8), {"tau_min": 4, "tau_max": 3}, "tau_max must be >= 4"),
        (("1.0", 1.0, 8), {}, "real number"),
        ((1e300, 1e-300, 8), {}, "overflows"),
    ],
)
def test_adacomm_validation(args, kwargs, match) -> None:
    with pytest.raises(LocalStepsError, match=match):
        adacomm_tau(*args, **kwargs)
    assert issubclass(LocalStepsError, ValueError)


def test_smoother_ema_hand_values() -> None:
    s = LossSmoother(beta=0.5)
    assert s.value is None
    assert s.update(1.0) == 1.0  # initialised with the first observation
    assert s.update(0.0) == 0.5
    assert s.update(0.5) == 0.5
    assert s.value == 0.5


def test_smoother_damps_noise_for_tau() -> None:
    noisy = [1.0, 0.2, 1.0, 0.2, 1.0, 0.2]
    raw_taus = [adacomm_tau(loss, 1.0, 16) for loss in noisy]
    s = LossSmoother(beta=0.9)
    smooth_taus = [adacomm_tau(s.update(loss), 1.0, 16) for loss in noisy]
    assert max(raw_taus) - min(raw_taus) == 16 - math.ceil(math.sqrt(0.2) * 16)
    assert max(smooth_taus) - min(smooth_taus) <= 2


def test_smoother_beta_zero_is_identity_and_state_roundtrip() -> None:
    s = LossSmoother(beta=0.0)
    assert s.update(3.0) == 3.0 and s.update(1.0) == 1.0
    t = LossSmoother(beta=0.8)
    t.update(2.0)
    t.update(1.0)
    restored = LossSmoother.from_state(t.state())
    assert restored.beta == 0.8 and restored.value == t.value
    assert restored.update(0.5) == t.update(0.5)


def test_smoother_validation() -> None:
    with pytest.raises(LocalStepsError, match=r"beta must be in \[0, 1\)"):
        LossSmoother(beta=1.0)
    s = LossSmoother()
    s.update(1.0)
    with pytest.raises(LocalStepsError, match="finite"):
        s.update(float("nan"))
    with pytest.raises(LocalStepsError, match=">= 0"):
        s.update(-1.0)
    assert s.value == 1.0  # unchanged by rejected updates
    with pytest.raises(LocalStepsError, match="'beta' and 'value'"):
        LossSmoother.from_state({"value": 1.0})
