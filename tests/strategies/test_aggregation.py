"""Tests for strategies.aggregation: FedAvg, FedNova and the solver norm ||a||_1."""

from __future__ import annotations

import numpy as np
import pytest

from strategies.aggregation import (
    AggregationError,
    fedavg_delta,
    fednova_delta,
    local_solver_coefficients,
    local_solver_norm,
)
from strategies.wire.errors import ConfigError
from strategies.wire.local_solver import LocalSolverError


def run_local_sgd(
    x0: np.ndarray,
    grads: list[np.ndarray],
    lr: float,
    momentum: float = 0.0,
    proximal_mu: float = 0.0,
) -> np.ndarray:
    """PyTorch-style SGD (first buffer = gradient) on a loss with the given
    per-step gradients plus the FedProx term mu/2 ||x - x0||^2; returns
    delta = x0 - x_tau."""
    x = x0.astype(np.float64).copy()
    buf = None
    for g in grads:
        d = g + proximal_mu * (x - x0)
        buf = d if buf is None else momentum * buf + d
        x = x - lr * buf
    return x0 - x


# --------------------------------------------------------------------------- #
# Hand-computed example: scalar model, linear losses F_i(x) = g_i x
# --------------------------------------------------------------------------- #
def test_objective_inconsistency_example_fedavg_vs_fednova() -> None:
    lr, taus, g, x_r = 0.1, (2, 8), (1.0, -1.0), 0.0
    deltas = []
    for tau, gi in zip(taus, g):
        delta = run_local_sgd(np.array([x_r]), [np.array([gi])] * tau, lr)
        assert delta[0] == pytest.approx(lr * tau * gi)  # delta_i = eta tau_i g_i
        deltas.append([delta.astype(np.float32)])
    n = [50, 50]  # p = (0.5, 0.5)

    x_fedavg = x_r - fedavg_delta(deltas, n)[0][0]
    assert x_fedavg == pytest.approx(0.30, abs=1e-7)

    a = [local_solver_norm(tau) for tau in taus]
    assert a == [2.0, 8.0]
    x_fednova = x_r - fednova_delta(deltas, n, a)[0][0]
    assert x_fednova == 0.0


def test_momentum_norm_hand_value() -> None:
    # 1 + 1.9 + 2.71
    assert local_solver_norm(3, momentum=0.9) == pytest.approx(5.61, abs=1e-12)


def test_plain_sgd_norm_is_steps() -> None:
    assert local_solver_norm(0) == 0.0
    assert local_solver_norm(17) == 17.0
    assert local_solver_norm(17, lr=0.5) == 17.0


def test_proximal_norm_hand_value() -> None:
    # eta*mu = 0.5: 1 + 0.5 + 0.25 = 1.75 = (1 - 0.5**3) / 0.5
    assert local_solver_norm(3, lr=0.5, proximal_mu=1.0) == pytest.approx(1.75)
    np.testing.assert_allclose(local_solver_coefficients(3, lr=0.5, proximal_mu=1.0), [0.25, 0.5, 1.0])


# --------------------------------------------------------------------------- #
# ||a||_1 against actual local SGD runs
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("momentum", [0.0, 0.5, 0.9, 0.99])
@pytest.mark.parametrize("steps", [1, 2, 7, 40])
def test_momentum_norm_matches_local_sgd_on_linear_loss(momentum: float, steps: int) -> None:
    rng = np.random.default_rng(steps)
    g = rng.standard_normal(5)
    x0 = rng.standard_normal(5)
    lr = 0.05
    delta = run_local_sgd(x0, [g] * steps, lr, momentum=momentum)
    np.testing.assert_allclose(delta, lr * g * local_solver_norm(steps, momentum=momentum), rtol=1e-10)


@pytest.mark.parametrize(("lr", "mu"), [(0.1, 0.01), (0.1, 1.0), (0.05, 5.0), (1.0, 1.0)])
@pytest.mark.parametrize("steps", [1, 3, 25])
def test_proximal_norm_matches_local_fedprox_on_linear_loss(lr: float, mu: float, steps: int) -> None:
    rng = np.random.default_rng(steps)
    g = rng.standard_normal(4)
    x0 = rng.standard_normal(4)
    delta = run_local_sgd(x0, [g] * steps, lr, proximal_mu=mu)
    expected_norm = (1 - (1 - lr * mu) ** steps) / (lr * mu)
    assert local_solver_norm(steps, lr=lr, proximal_mu=mu) == pytest.approx(expected_norm)
    np.testing.assert_allclose(delta, lr * g * expected_norm, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize(("momentum", "lr", "mu"), [(0.9, 0.01, 0.1), (0.5, 0.1, 1.0), (0.9, 0.05, 0.5)])
def test_momentum_with_proximal_norm_matches_local_run(momentum: float, lr: float, mu: float) -> None:
    rng = np.random.default_rng(0)
    g = rng.standard_normal(3)
    x0 = rng.standard_normal(3)
    steps = 12
    delta = run_local_sgd(x0, [g] * steps, lr, momentum=momentum, proximal_mu=mu)
    norm = local_solver_norm(steps, momentum=momentum, lr=lr, proximal_mu=mu)
    np.testing.assert_allclose(delta, lr * g * norm, rtol=1e-10)
    # The proximal pull shrinks the norm below the momentum-only value.
    assert norm < local_solver_norm(steps, momentum=momentum)


@pytest.mark.parametrize(("momentum", "lr", "mu"), [(0.0, 0.0, 0.0), (0.9, 0.0, 0.0), (0.0, 0.1, 2.0), (0.7, 0.05, 1.0)])
def test_coefficients_match_local_run_with_varying_gradients(momentum: float, lr: float, mu: float) -> None:
    """delta = eta * sum_k a_k g_k for arbitrary (time-varying) gradients."""
    rng = np.random.default_rng(1)
    steps = 9
    grads = [rng.standard_normal(6) for _ in range(steps)]
    x0 = rng.standard_normal(6)
    step_lr = lr if lr > 0 else 0.1
    a = local_solver_coefficients(steps, momentum=momentum, lr=lr, proximal_mu=mu)
    delta = run_local_sgd(x0, grads, step_lr, momentum=momentum, proximal_mu=mu)
    expected = step_lr * sum(a_k * g_k for a_k, g_k in zip(a, grads))
    np.testing.assert_allclose(delta, expected, rtol=1e-10, atol=1e-13)
    assert a.sum() == pytest.approx(local_solver_norm(steps, momentum=momentum, lr=lr, proximal_mu=mu))
    if momentum and not mu:
        np.testing.assert_allclose(a, [(1 - momentum ** (steps - k)) / (1 - momentum) for k in range(steps)])
    if mu and not momentum:
        np.testing.assert_allclose(a, [(1 - lr * mu) ** (steps - 1 - k) for k in range(steps)])


# --------------------------------------------------------------------------- #
# FedAvg / FedNova behaviour
# --------------------------------------------------------------------------- #
def test_fedavg_weights_by_examples_and_keeps_float_dtypes() -> None:
    d1 = [np.array([1.0, 2.0], dtype=np.float32), np.array([[4.0]], dtype=np.float64)]
    d2 = [np.array([3.0, -2.0], dtype=np.float32), np.array([[0.0]], dtype=np.float64)]
    out = fedavg_delta([d1, d2], [1, 3])
    np.testing.assert_allclose(out[0], [2.5, -1.0])
    np.testing.assert_allclose(out[1], [[1.0]])
    assert out[0].dtype == np.float32 and out[1].dtype == np.float64
    assert out[1].shape == (1, 1)


def test_fedavg_accumulates_in_float64() -> None:
    # 1e8 + 1 is not representable in float32 but the average 0.5e8 + 0.5 rounds correctly.
    big = [np.array([1e8], dtype=np.float32)]
    small = [np.array([1.0], dtype=np.float32)]
    out = fedavg_delta([big, small, small], [1, 1, 1])
    assert out[0][0] == np.float32((1e8 + 2.0) / 3)


def test_integer_buffers_are_averaged_and_rounded() -> None:
    d1 = [np.array([1.0]), np.array(-1, dtype=np.int64)]
    d2 = [np.array([1.0]), np.array(-2, dtype=np.int64)]
    out = fedavg_delta([d1, d2], [3, 1])  # -1.25 -> -1
    assert out[1].dtype == np.int64 and out[1].shape == () and int(out[1]) == -1
    out = fedavg_delta([d1, d2], [1, 3])  # -1.75 -> -2
    assert int(out[1]) == -2


def test_fednova_integer_buffers_get_fedavg_treatment() -> None:
    d1 = [np.array([2.0]), np.array([-4], dtype=np.int32)]
    d2 = [np.array([8.0]), np.array([-8], dtype=np.int32)]
    out = fednova_delta([d1, d2], [1, 1], [2.0, 8.0])
    assert out[1].dtype == np.int32 and int(out[1][0]) == -6
    # floats: tau_eff = 5; 5 * (0.5 * 2/2 + 0.5 * 8/8) = 5
    assert out[0][0] == pytest.approx(5.0)


def test_fednova_equals_fedavg_for_equal_norms() -> None:
    rng = np.random.default_rng(3)
    deltas = [[rng.standard_normal((3, 2)), rng.standard_normal(4)] for _ in range(4)]
    n = [5, 1, 7, 2]
    for a, b in zip(fedavg_delta(deltas, n), fednova_delta(deltas, n, [6.5] * 4)):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_fednova_uses_arithmetic_tau_eff_not_harmonic_mean() -> None:
    deltas = [[np.array([2.0])], [np.array([8.0])]]
    out = fednova_delta(deltas, [1, 1], [2.0, 8.0])
    # paper: tau_eff = 5 and normalised updates are both 1 -> 5.0;
    # renormalising the weights (Flower baseline) would give the harmonic mean 3.2.
    assert out[0][0] == pytest.approx(5.0)


# --------------------------------------------------------------------------- #
# Validation
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize(
    ("deltas", "n", "match"),
    [
        ([], [], "no updates"),
        ([[np.zeros(2)], [np.zeros(2), np.zeros(1)]], [1, 1], "has 2 arrays"),
        ([[np.zeros(2)], [np.zeros(3)]], [1, 1], "shape"),
        ([[np.zeros(2)], [np.zeros(2, dtype=np.float32)]], [1, 1], "dtype"),
        ([[np.zeros(2)], [np.array([0.0, np.nan])]], [1, 1], "NaN or inf"),
        ([[np.zeros(2)], [[0.0, 0.0]]], [1, 1], "numpy.ndarray"),
        ([[np.zeros(2, dtype=bool)]], [1], "unsupported dtype"),
        ([[np.zeros(2)]], [1, 2], "num_examples has 2 entries"),
        ([[np.zeros(2)]], [0], "must be finite and > 0"),
        ([[np.zeros(2)]], [-3], "must be finite and > 0"),
        ([[np.zeros(2)]], [True], "real number"),
    ],
)
def test_fedavg_rejects_bad_input(deltas, n, match) -> None:
    with pytest.raises(AggregationError, match=match):
        fedavg_delta(deltas, n)


def test_fednova_rejects_bad_norms() -> None:
    deltas = [[np.zeros(2)], [np.zeros(2)]]
    with pytest.raises(AggregationError, match="a_norms"):
        fednova_delta(deltas, [1, 1], [1.0, 0.0])
    with pytest.raises(AggregationError, match="a_norms has 1 entries"):
        fednova_delta(deltas, [1, 1], [1.0])
    with pytest.raises(AggregationError, match="a_norms"):
        fednova_delta(deltas, [1, 1], [1.0, float("inf")])
    assert issubclass(AggregationError, ValueError)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"steps": -1}, "steps must be >= 0"),
        ({"steps": 2.0}, "steps must be an int"),
        ({"steps": 2, "momentum": 1.0}, r"momentum must be in \[0, 1\)"),
        ({"steps": 2, "momentum": -0.1}, "momentum must be finite and >= 0"),
        ({"steps": 2, "lr": float("nan")}, "lr must be finite"),
        ({"steps": 2, "proximal_mu": 0.1}, "needs the local learning rate"),
        ({"steps": 2, "lr": 1.0, "proximal_mu": 1.5}, "overshoots"),
        ({"steps": 30, "momentum": 0.99, "lr": 0.9, "proximal_mu": 1.0}, "negative"),
    ],
)
def test_local_solver_norm_validation(kwargs, match) -> None:
    with pytest.raises(LocalSolverError, match=match):
        local_solver_norm(**kwargs)
    assert issubclass(LocalSolverError, ConfigError)  # bad solver settings: a run-config error
