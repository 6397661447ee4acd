"""FedNova's a-norm is computed by the server from the reported steps (issue #11 item 4)."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from flwr.app import ArrayRecord

from strategies.aggregation import local_solver_norm
from strategies.plugins.registries import AGGREGATORS, SCHEDULES, SELECTORS
from strategies.rounds.federated_strategy import FederatedStrategy
from strategies.wire import message_keys as keys
from strategies.wire.local_solver import LocalSolver
from tests.strategies.scripted_grid import flower_round, scripted_grid
from tests.strategies.test_federated_strategy import _reply, _train_metrics

pytestmark = pytest.mark.usefixtures("server_identity")


@pytest.mark.parametrize("solver", [
    LocalSolver("sgd", momentum=0.0, lr=0.1),
    LocalSolver("sgd", momentum=0.9, lr=0.1),
    LocalSolver("sgd", momentum=0.0, lr=0.1, proximal_mu=1.0),
    LocalSolver("sgd", momentum=0.5, lr=0.1, proximal_mu=0.5),
    LocalSolver("adam", momentum=0.9, lr=0.1, proximal_mu=1.0),
])
@pytest.mark.parametrize("steps", [1, 3, 8])
def test_a_norm_is_local_solver_norm_as_the_client_computed_it(solver, steps):
    momentum = solver.momentum if solver.optimizer == "sgd" else 0.0
    assert solver.a_norm(steps) == local_solver_norm(
        steps, momentum=momentum, lr=solver.lr, proximal_mu=solver.proximal_mu)


def _round(solver: LocalSolver, replies_metrics: list[dict], tau: int = 8):
    # a steps floor below every reply here (2 of 8 steps counts as itself): the a-norms
    # are the server's from the steps (tests/strategies/test_fednova_steps_bound.py: the floor)
    strategy = FederatedStrategy(aggregator=AGGREGATORS.create("fednova",
                                                               min_steps_fraction=0.05),
                                 schedule=SCHEDULES.create("fixed", tau0=tau),
                                 selector=SELECTORS.create("uniform"),
                                 min_nodes=2, node_wait_timeout=1, local_solver=solver)
    deltas = ([np.array([0.2])], [np.array([-0.8])])
    grid = scripted_grid({node: partial(_reply, delta=delta, metrics=metrics, site=name)
                          for node, delta, metrics, name
                          in zip((2, 3), deltas, replies_metrics, "ab")})
    arrays, _ = flower_round(strategy, 1, grid, ArrayRecord([np.zeros(1)]))
    return strategy, arrays


@pytest.mark.parametrize("bogus", [0.0, 1e-300, 1e300])
def test_bogus_a_norm_from_a_site_is_ignored(bogus):
    solver = LocalSolver("sgd", momentum=0.9, lr=0.1)
    honest_metrics = _train_metrics(10, steps=2)
    del honest_metrics[keys.A_NORM]  # a reply is valid without a-norm
    _, honest = _round(solver, [honest_metrics, _train_metrics(10, steps=8)])
    strategy, bogus_arrays = _round(solver, [_train_metrics(10, steps=2, a_norm=bogus),
                                             _train_metrics(10, steps=8, a_norm=bogus)])
    np.testing.assert_array_equal(bogus_arrays.to_numpy_ndarrays()[0],
                                  honest.to_numpy_ndarrays()[0])
    train = strategy.reports[1].train
    assert train["a"][keys.A_NORM] == solver.a_norm(2)  # the server value is what is logged
    assert train["b"][keys.A_NORM] == solver.a_norm(8)
    tau_eff = 0.5 * (solver.a_norm(2) + solver.a_norm(8))
    assert strategy.reports[1].strategy["tau-eff"] == pytest.approx(tau_eff)


@pytest.mark.parametrize(("steps", "reason"), [(0, "positive integer"), (9, "<= 8"),
                                               (2.5, "whole numbers")])
def test_steps_outside_one_to_tau_drop_the_reply(steps, reason):
    strategy, _ = _round(LocalSolver(), [_train_metrics(10, steps=steps),
                                         _train_metrics(10, steps=8)])
    dropped = strategy.reports[1].train_dropped
    assert list(dropped) == ["a"] and reason in dropped["a"]
