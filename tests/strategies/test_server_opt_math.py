"""Each server optimizer's step against a hand computation of its paper's equations.

A tiny model of two trained arrays ``w`` (2 entries) and ``b`` (1), plus a normalisation
statistic the optimizers must leave alone, over two rounds. Reddi et al. (ICLR 2021,
Algorithm 2) write the descent direction ``Delta_t = -Delta`` (our ``Delta`` is ``x - mean
of the sites' models``) and ``x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)``; FedAvgM (Hsu et
al. 2019) ``v <- beta v + Delta``, ``x <- x - eta v``.
"""

from __future__ import annotations

import numpy as np
import pytest

from strategies.aggregation import apply_update
from strategies.plugins.registries import SERVER_OPTIMIZERS

X0 = [np.array([1.0, -1.0]), np.array([0.5])]
#: The paper's Delta_t of rounds 1 and 2 (ours is minus these).
PAPER_DELTA = [[np.array([-1.0, 2.0]), np.array([-2.0])],
               [np.array([-1.0, 0.5]), np.array([2.0])]]
#: beta1, beta2, tau, eta chosen for round numbers.
ADAPTIVE = {"beta1": 0.5, "beta2": 0.75, "tau": 1.0, "eta": 1.0}
#: m_1 = 0.5 Delta_1; m_2 = 0.5 m_1 + 0.5 Delta_2 (every adaptive optimizer).
M1 = [[-0.5, 1.0], [-1.0]]
M2 = [[-0.25 - 0.5, 0.5 + 0.25], [-0.5 + 1.0]]
#: v_1, v_2 of each (from v_0 = 0):
V = {
    # eq. (2) v_t = v_{t-1} + Delta_t^2
    "adagrad": ([[1.0, 4.0], [4.0]], [[1.0 + 1.0, 4.0 + 0.25], [4.0 + 4.0]]),
    # eq. (3) v_t = 0.75 v_{t-1} + 0.25 Delta_t^2
    "adam": ([[0.25, 1.0], [1.0]], [[0.1875 + 0.25, 0.75 + 0.0625], [0.75 + 1.0]]),
    # eq. (4) v_t = v_{t-1} - 0.25 Delta_t^2 sign(v_{t-1} - Delta_t^2): round 1 sign -1 (v_0 = 0);
    # round 2: w0 0.25 < 1 (-1), w1 1 > 0.25 (+1), b 1 < 4 (-1)
    "yogi": ([[0.25, 1.0], [1.0]], [[0.25 + 0.25, 1.0 - 0.0625], [1.0 + 1.0]]),
}


def _ours(round_index: int) -> list[np.ndarray]:
    return [-d for d in PAPER_DELTA[round_index]]


def _run(optimizer, trained=(True, True)) -> list[list[np.ndarray]]:
    """The model after each of the two rounds."""
    x, models = [a.copy() for a in X0], []
    for t in range(2):
        step = optimizer.step(_ours(t), list(trained))
        x = [a - s for a, s in zip(x, step)]
        models.append(x)
    return models


def _expected_x(m1, v1, m2, v2) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """x_1 = x_0 + m_1 / (sqrt(v_1) + 1), x_2 = x_1 + m_2 / (sqrt(v_2) + 1) (eta 1, tau 1)."""
    x1 = [x + np.array(m) / (np.sqrt(np.array(v)) + 1.0) for x, m, v in zip(X0, m1, v1)]
    x2 = [x + np.array(m) / (np.sqrt(np.array(v)) + 1.0) for x, m, v in zip(x1, m2, v2)]
    return x1, x2


@pytest.mark.parametrize("name", ["adagrad", "adam", "yogi"])
def test_the_adaptive_optimizers_follow_algorithm_2(name):
    options = {k: v for k, v in ADAPTIVE.items() if k != "beta2" or name != "adagrad"}
    optimizer = SERVER_OPTIMIZERS.create(name, **options)
    x1, x2 = _run(optimizer)
    v1, v2 = V[name]
    want1, want2 = _expected_x(M1, v1, M2, v2)
    for got, want in zip(x1 + x2, want1 + want2):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    for got, want in zip(optimizer.m + optimizer.v, [*map(np.array, M2), *map(np.array, v2)]):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    assert optimizer.rounds == 2


def test_hand_numbers_of_adam_round_one():
    """x_1 = (1 - 0.5 / 1.5, -1 + 1 / 2), (0.5 - 1 / 2)."""
    x1, _ = _run(SERVER_OPTIMIZERS.create("adam", **ADAPTIVE))
    np.testing.assert_allclose(x1[0], [2.0 / 3.0, -0.5], rtol=1e-12)
    np.testing.assert_allclose(x1[1], [0.0], atol=1e-15)


def test_fedavgm_is_heavy_ball_on_the_pseudo_gradient():
    """beta 0.5, eta 0.5: v_1 = D_1 = (1, -2), (2); x_1 = x_0 - 0.5 v_1 = (0.5, 0), (-0.5);
    v_2 = 0.5 v_1 + D_2 = (1.5, -1.5), (-1); x_2 = x_1 - 0.5 v_2 = (-0.25, 0.75), (0)."""
    optimizer = SERVER_OPTIMIZERS.create("avgm", eta=0.5, momentum=0.5)
    x1, x2 = _run(optimizer)
    np.testing.assert_allclose(np.concatenate(x1), [0.5, 0.0, -0.5], atol=1e-15)
    np.testing.assert_allclose(np.concatenate(x2), [-0.25, 0.75, 0.0], atol=1e-15)
    np.testing.assert_allclose(np.concatenate(optimizer.velocity), [1.5, -1.5, -1.0])


def test_sgd_with_a_server_learning_rate():
    """eta 0.5: x_2 = x_0 - 0.5 (D_1 + D_2) = (1 - 1, -1 + 1.25), (0.5 - 0)."""
    _, x2 = _run(SERVER_OPTIMIZERS.create("sgd", eta=0.5))
    np.testing.assert_allclose(np.concatenate(x2), [0.0, 0.25, 0.5], atol=1e-15)


def test_default_sgd_returns_the_aggregators_update_itself():
    """``sgd`` with its default eta: the step IS Delta, so the model is ``x - Delta`` bit for
    bit, as before server optimizers existed."""
    delta = [np.array([0.1, -0.3], np.float32), np.array([0.7], np.float32),
             np.array(-2, np.int64)]
    step = SERVER_OPTIMIZERS.create("sgd").step(delta, [True, True, False])
    assert all(s is d for s, d in zip(step, delta))
    reference = [np.array([1.0, 2.0], np.float32), np.array([3.0], np.float32),
                 np.array(5, np.int64)]
    new, _ = apply_update(reference, step, ["w", "b", "n"])
    old, _ = apply_update(reference, delta, ["w", "b", "n"])
    for a, b in zip(new, old):
        assert a.tobytes() == b.tobytes() and a.dtype == b.dtype


@pytest.mark.parametrize("name", ["avgm", "adagrad", "adam", "yogi"])
def test_statistics_and_integer_buffers_take_the_plain_update(name):
    delta = [np.array([0.1, -0.3], np.float32), np.array([0.25], np.float32),
             np.array(-2, np.int64)]
    optimizer = SERVER_OPTIMIZERS.create(name)
    step = optimizer.step(delta, [True, False, False])
    assert step[1] is delta[1] and step[2] is delta[2]
    assert step[0].dtype == np.float32
    moments = optimizer.velocity if name == "avgm" else optimizer.m
    assert [m.shape for m in moments] == [(2,)]  # state for the trained array only
