"""Tests of the benchmark simulation helpers (``bench/sim_quadratic.py``, ``sim_local_sgd.py``, ``curves.py``).

The FedNova and AdaComm benchmarks rest on these helpers; each test checks a
number that can be derived by hand (closed-form fixed points, the runtime
model, one SGD step).
"""

from __future__ import annotations

import numpy as np
import pytest

import curves
import sim_local_sgd
import sim_quadratic as sim
from strategies.aggregation import local_solver_norm

TAUS = [1, 2, 4, 8, 2, 8, 1, 4]


@pytest.fixture()
def problem():
    rng = np.random.default_rng(7)
    centers = rng.standard_normal((8, 5))
    n = rng.integers(50, 500, 8)
    x_star = (n / n.sum()) @ centers
    return centers, n, x_star


# --------------------------------------------------------------------------- #
# Quadratics: local solver and fixed points
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("tau", [0, 1, 3, 16])
def test_local_response_of_plain_sgd_is_one_minus_lr_to_the_tau(tau):
    assert sim.local_response(tau, 0.05) == pytest.approx(0.95**tau, rel=1e-12)


def test_local_solver_is_affine_in_the_start_point_with_momentum(problem):
    centers, _, _ = problem
    x = np.linspace(-1.0, 2.0, centers.shape[1])
    out = sim.local_sgd_quadratic(x, centers, TAUS, 0.03, momentum=0.9)
    for i, tau in enumerate(TAUS):
        s = sim.local_response(tau, 0.03, 0.9)
        np.testing.assert_allclose(out[i], centers[i] + s * (x - centers[i]), atol=1e-12)
    # Heavy-ball step 2 by hand (first buffer = gradient): x2 = x1 - lr (rho g0 + g1).
    s2 = sim.local_response(2, 0.1, 0.5)
    x1 = 1 - 0.1 * 1
    assert s2 == pytest.approx(x1 - 0.1 * (0.5 * 1 + x1))


def test_fedavg_simulated_fixed_point_equals_closed_form(problem):
    centers, n, x_star = problem
    lr = 0.05
    sim_fp, _ = sim.iterate_to_fixed_point(centers, n, TAUS, lr, "fedavg")
    s = [(1 - lr) ** t for t in TAUS]
    closed = sim.closed_form_fixed_point(centers, n, s)
    p = n / n.sum()
    v = p * (1 - np.array(s))
    np.testing.assert_allclose(closed, (v / v.sum()) @ centers, atol=1e-14)
    np.testing.assert_allclose(sim_fp, closed, atol=1e-9)
    # Heterogeneous steps move FedAvg away from the true optimum.
    assert np.linalg.norm(sim_fp - x_star) > 0.1


def test_fednova_fixed_point_equals_closed_form_and_beats_fedavg(problem):
    centers, n, x_star = problem
    lr = 0.05
    nova, _ = sim.iterate_to_fixed_point(centers, n, TAUS, lr, "fednova")
    avg, _ = sim.iterate_to_fixed_point(centers, n, TAUS, lr, "fedavg")
    s = [sim.local_response(t, lr) for t in TAUS]
    closed = sim.closed_form_fixed_point(centers, n, s, [float(t) for t in TAUS])
    np.testing.assert_allclose(nova, closed, atol=1e-9)
    assert np.linalg.norm(nova - x_star) < 0.25 * np.linalg.norm(avg - x_star)


@pytest.mark.parametrize("method", ["fedavg", "fednova"])
def test_equal_local_steps_converge_to_the_true_optimum(problem, method):
    centers, n, x_star = problem
    fp, _ = sim.iterate_to_fixed_point(centers, n, [5] * 8, 0.05, method)
    np.testing.assert_allclose(fp, x_star, atol=1e-9)


def test_fednova_fixed_point_tends_to_x_star_as_lr_vanishes(problem):
    centers, n, x_star = problem
    a = [float(t) for t in TAUS]

    def nova_error(lr):
        s = [(1 - lr) ** t for t in TAUS]
        return np.linalg.norm(sim.closed_form_fixed_point(centers, n, s, a) - x_star)

    # Plain SGD, small-lr regime of the paper: FedNova solves the true objective.
    assert nova_error(1e-7) < 1e-6
    # ... and the residual inconsistency is first order in lr.
    assert nova_error(1e-3) / nova_error(1e-4) == pytest.approx(10.0, rel=0.02)
    s = [(1 - 1e-7) ** t for t in TAUS]
    assert np.linalg.norm(sim.closed_form_fixed_point(centers, n, s) - x_star) > 0.1


def test_fednova_with_momentum_uses_the_momentum_solver_norm(problem):
    centers, n, _ = problem
    lr, rho = 0.005, 0.9
    fp, _ = sim.iterate_to_fixed_point(centers, n, TAUS, lr, "fednova", momentum=rho)
    s = [sim.local_response(t, lr, rho) for t in TAUS]
    a = [local_solver_norm(t, momentum=rho) for t in TAUS]
    np.testing.assert_allclose(fp, sim.closed_form_fixed_point(centers, n, s, a), atol=1e-9)


def test_noisy_time_average_is_close_to_the_noiseless_fixed_point(problem):
    centers, n, _ = problem
    lr = 0.05
    mean, per_chain = sim.average_iterate(
        centers, n, TAUS, lr, "fedavg", 0.5, chains=8, burn_in=100, rounds=400, seed=0
    )
    closed = sim.closed_form_fixed_point(centers, n, [(1 - lr) ** t for t in TAUS])
    se = per_chain.std(axis=0, ddof=1) / np.sqrt(8)
    assert per_chain.shape == (8, centers.shape[1])
    assert np.all(np.abs(mean - closed) < 5 * se + 1e-3)


# --------------------------------------------------------------------------- #
# Runtime model
# --------------------------------------------------------------------------- #
def test_round_time_is_slowest_site_compute_plus_delay():
    step_times = np.array([[1.0, 2.0, 0.5], [0.2, 0.2, 0.2], [3.0, 0.1, 0.4]])
    assert sim_local_sgd.round_time(step_times, 10.0) == pytest.approx(3.5 + 10.0)


def test_step_times_are_shifted_exponentials():
    y = sim_local_sgd.sample_step_times(np.random.default_rng(0), 8, 5000, 0.5, 0.5)
    assert y.shape == (8, 5000)
    assert y.min() >= 0.5
    assert y.mean() == pytest.approx(1.0, abs=0.02)


# --------------------------------------------------------------------------- #
# Least squares and local-update SGD
# --------------------------------------------------------------------------- #
@pytest.fixture(scope="module")
def fed():
    return sim_local_sgd.make_least_squares_federation(4, 6, seed=3, min_examples=30, max_examples=60)


def test_least_squares_loss_and_optimum(fed):
    x = np.linspace(-1.0, 1.0, 6)
    direct = sum(
        p * np.sum((xi[:n] @ x - yi[:n]) ** 2) / (2 * n)
        for p, n, xi, yi in zip(fed.weights, fed.num_examples, fed.features, fed.targets)
    )
    assert fed.loss(x) == pytest.approx(direct, rel=1e-12)
    x_star = fed.optimum()
    np.testing.assert_allclose(fed.hessian @ x_star - fed.linear, 0.0, atol=1e-10)
    assert fed.loss(x_star) < fed.loss(x_star + 0.01)


def test_local_sgd_least_squares_matches_a_hand_computed_step(fed):
    x0 = np.full(6, 0.3)
    out, first = sim_local_sgd.local_sgd_least_squares(fed, x0, 1, 0.1, 3, np.random.default_rng(5))
    idx = (np.random.default_rng(5).random((1, 4, 3)) * fed.num_examples[:, None]).astype(int)[0]
    for i in range(4):
        xb, yb = fed.features[i, idx[i]], fed.targets[i, idx[i]]
        r = xb @ x0 - yb
        np.testing.assert_allclose(out[i], x0 - 0.1 * xb.T @ r / 3, atol=1e-12)
        assert first[i] == pytest.approx(0.5 * np.mean(r**2))


def test_fixed_tau_run_follows_the_runtime_model(fed):
    trace = sim_local_sgd.run_local_update_sgd(fed, 3, 500.0, 0.02, 4, 10.0, 0.5, 0.5, seed=1)
    assert np.all(trace.taus == 3)
    assert trace.times[-1] >= 500.0 > trace.times[-2]
    assert np.all(np.diff(trace.times) >= 3 * 0.5 + 10.0)
    assert trace.losses[-1] < 0.25 * trace.losses[0]


def test_adacomm_run_starts_at_tau0_and_shrinks_tau(fed):
    trace = sim_local_sgd.run_local_update_sgd(
        fed, "adacomm", 3000.0, 0.02, 4, 10.0, 0.5, 0.5, seed=1, tau0=16, tau_min=2
    )
    assert trace.taus[0] == 16
    assert trace.taus.min() >= 2 and trace.taus.max() <= 16
    assert trace.taus[-10:].mean() < trace.taus[:10].mean()
    # tau_(l+1) = ceil(sqrt(F_l / F_0) * tau0), clamped, with the smoothed loss it saw.
    expected = np.maximum(2, np.ceil(np.sqrt(trace.loss_estimates / trace.loss_estimates[0]) * 16))
    np.testing.assert_array_equal(trace.taus[1:], np.minimum(expected[:-1], 16))


def test_curve_helpers():
    times = np.array([0.0, 2.0, 5.0])
    losses = np.array([9.0, 4.0, 1.0])
    grid = np.array([0.0, 1.9, 2.0, 4.0, 6.0])
    curve = curves.loss_on_grid(times, losses, grid)
    np.testing.assert_array_equal(curve, [9.0, 9.0, 4.0, 4.0, 1.0])
    assert curves.time_to_reach(grid, curve, 4.0) == 2.0
    assert curves.time_to_reach(grid, curve, 0.5) == float("inf")
    np.testing.assert_allclose(curves.trailing_mean(np.array([1.0, 3.0, 5.0, 7.0]), 2), [1, 2, 4, 6])
    assert curves.rounds_to_target([0.5, 0.9, 0.9, 0.9], 0.8, 2) == 3  # trailing 0.5, 0.7, 0.9
    assert curves.rounds_to_target([0.5, 0.9], 0.8, 1) == 2
    assert curves.rounds_to_target([0.5, 0.6], 0.8, 1) is None
