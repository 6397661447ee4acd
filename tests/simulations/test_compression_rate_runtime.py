"""The adaptive-compression-rate simulation's pieces on a tiny federation (milliseconds)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.simulations import compression_rate_runtime as bench
from tests.simulations.least_squares import make_least_squares_federation


@pytest.fixture()
def fed():
    return make_least_squares_federation(3, 20, 0, min_examples=20, max_examples=40)


def test_site_losses_weight_to_the_global_loss(fed) -> None:
    x = np.linspace(-1, 1, 20)
    assert fed.weights @ bench.site_losses(fed, x) == pytest.approx(fed.loss(x))


def test_a_slower_link_costs_more_time_to_the_same_target(fed, monkeypatch) -> None:
    monkeypatch.setattr(bench, "MAX_ROUNDS", 300)
    f_star, f_zero = fed.loss(fed.optimum()), fed.loss(np.zeros(20))
    target = f_star + 0.3 * (f_zero - f_star)
    fast = bench.run(fed, 0.5, link_mbps=1.0, target=target, seed=1)
    slow = bench.run(fed, 0.5, link_mbps=1e-5, target=target, seed=1)
    assert fast["rounds"] == slow["rounds"] and fast["time"] < slow["time"]
    adaptive = bench.run(fed, "adaptive-full", link_mbps=1e-5, target=target, seed=1)
    assert adaptive["time"] is not None
    assert bench.ADAPTIVE["min"] <= adaptive["final_rate"] <= bench.ADAPTIVE["max"]


def test_adaptive_rate_on_full_losses_is_as_fast_as_the_best_fixed_rate(monkeypatch) -> None:
    """The claim on federation 0, fast link: fed the sites' full losses, the adaptive rate
    reaches the target within 10% of the best fixed rate in hindsight."""
    monkeypatch.setattr(bench, "FIXED_RATES", [0.03, 0.1, 0.3])
    monkeypatch.setattr(bench, "ADAPTIVE_SIGNALS", ["adaptive-full"])
    link = bench.run_link("fast", bench.LINKS["fast"], seeds=1)
    assert link["best_fixed_rate"] == "0.1"
    assert link["over_best"]["adaptive-full"] <= 1.1
