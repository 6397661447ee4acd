"""The AdaComm simulation's least squares and runtime model (:mod:`least_squares`: one SGD
step, the round time by hand), its curves and its claims (:mod:`adacomm_runtime`)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.simulations import adacomm_runtime as study
from tests.simulations import least_squares as sim


def test_round_time_is_slowest_site_compute_plus_delay():
    step_times = np.array([[1.0, 2.0, 0.5], [0.2, 0.2, 0.2], [3.0, 0.1, 0.4]])
    assert sim.round_time(step_times, 10.0) == pytest.approx(3.5 + 10.0)


def test_step_times_are_shifted_exponentials():
    y = sim.sample_step_times(np.random.default_rng(0), 8, 5000, 0.5, 0.5)
    assert y.shape == (8, 5000)
    assert y.min() >= 0.5
    assert y.mean() == pytest.approx(1.0, abs=0.02)


@pytest.fixture(scope="module")
def fed():
    return sim.make_least_squares_federation(4, 6, seed=3, min_examples=30, max_examples=60)


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
    out, first = sim.local_sgd_least_squares(fed, x0, 1, 0.1, 3, np.random.default_rng(5))
    idx = (np.random.default_rng(5).random((1, 4, 3)) * fed.num_examples[:, None]).astype(int)[0]
    for i in range(4):
        xb, yb = fed.features[i, idx[i]], fed.targets[i, idx[i]]
        r = xb @ x0 - yb
        np.testing.assert_allclose(out[i], x0 - 0.1 * xb.T @ r / 3, atol=1e-12)
        assert first[i] == pytest.approx(0.5 * np.mean(r**2))


def test_fixed_tau_run_follows_the_runtime_model(fed):
    trace = sim.run_local_update_sgd(fed, 3, 500.0, 0.02, 4, 10.0, 0.5, 0.5, seed=1)
    assert np.all(trace.taus == 3)
    assert trace.times[-1] >= 500.0 > trace.times[-2]
    assert np.all(np.diff(trace.times) >= 3 * 0.5 + 10.0)
    assert trace.losses[-1] < 0.25 * trace.losses[0]


def test_adacomm_run_starts_at_tau0_and_shrinks_tau(fed):
    trace = sim.run_local_update_sgd(
        fed, "adacomm", 3000.0, 0.02, 4, 10.0, 0.5, 0.5, seed=1, tau0=16, tau_min=2
    )
    assert trace.taus[0] == 16
    assert trace.taus.min() >= 2 and trace.taus.max() <= 16
    assert trace.taus[-10:].mean() < trace.taus[:10].mean()
    # tau_(l+1) = ceil(sqrt(F_l / F_0) * tau0), clamped, with the smoothed loss it saw.
    expected = np.maximum(2, np.ceil(np.sqrt(trace.loss_estimates / trace.loss_estimates[0]) * 16))
    np.testing.assert_array_equal(trace.taus[1:], np.minimum(expected[:-1], 16))


def test_the_loss_curve_on_a_grid_and_its_first_time_at_a_target():
    times = np.array([0.0, 2.0, 5.0])
    losses = np.array([9.0, 4.0, 1.0])
    grid = np.array([0.0, 1.9, 2.0, 4.0, 6.0])
    curve = study.loss_on_grid(times, losses, grid)
    np.testing.assert_array_equal(curve, [9.0, 9.0, 4.0, 4.0, 1.0])
    assert study.time_to_reach(grid, curve, 4.0) == 2.0
    assert study.time_to_reach(grid, curve, 0.5) == float("inf")


def test_adacomm_needs_half_tau1s_time_to_its_loss_and_ends_below_tau0():
    """The claims on federation 0 (two run seeds): AdaComm reaches fixed tau=1's final loss in
    at most half of tau=1's simulated time and ends below fixed tau0 = 16."""
    problem = study.run_problem(0, run_seeds=2)
    assert problem["summary"]["speedup_target_met"]
    assert problem["summary"]["below_tau0_target_met"]
    assert problem["methods"]["adacomm"]["tau_at_budget_fraction_seed0"]["0%"] == 16
