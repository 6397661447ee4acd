"""FedNova's server momentum is the server optimizer's (#45): ``strategy.server-opt = "avgm"``.

Wang et al. 2020 (FedNova, Sec. 5) add heavy-ball momentum on the server,
``v <- beta v + Delta``, ``x <- x - v``, with FedNova's ``Delta = tau_eff sum_i p_i
delta_i / ||a_i||_1``. The product once kept it in the aggregator
(``fednova.server-momentum``); it is FedAvgM's step (Hsu et al. 2019) with ``eta = 1``,
so the key is refused naming its replacement, and FedNova + avgm(beta) walks the model
sequence of the former recurrence, written out here as the reference.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MessageType

from app.config.run_config import RunConfig
from app.engine import InProcessGrid, VirtualSite
from app.server_app import build_strategy
from strategies.wire import message_keys as keys
from strategies.wire.plugin_options import PluginError
from tests.fixtures.scripted_site import ScriptedSite

pytestmark = pytest.mark.usefixtures("server_identity")  # run 42, the SuperLink's node 1

TAU, BETA, ROUNDS = 4, 0.5, 3
#: Per site: examples, steps reported (1 < 0.5 tau: its a-norm counts as 2), its optimum.
SITES = [(10, 4, np.array([1.0, -2.0, 0.5])), (30, 3, np.array([-1.0, 0.0, 2.0])),
         (20, 1, np.array([3.0, 1.0, -1.0]))]
X0 = [np.array([0.2, 0.4, -0.6], np.float32), np.array([1.0, -1.0], np.float32)]


def _local_delta(weights: list[np.ndarray], optimum: np.ndarray) -> list[np.ndarray]:
    """A site's update ``x_global - x_local``: half-way to its optimum, ``b`` by a tenth."""
    return [(0.5 * (weights[0] - optimum)).astype(np.float32),
            (0.1 * weights[1]).astype(np.float32)]


class _Site(ScriptedSite):
    """Reports ``steps`` local steps and records each global model it is sent."""

    def __init__(self, name: str, num_examples: int, steps: int, optimum: np.ndarray) -> None:
        super().__init__(name, num_examples=num_examples, delta=self._answer)
        self.steps, self.optimum, self.seen = steps, optimum, []

    def _answer(self, weights: list[np.ndarray]) -> list[np.ndarray]:
        self.seen.append([w.copy() for w in weights])
        return _local_delta(weights, self.optimum)

    def __call__(self, message: Message, context: Context) -> Message:
        reply = super().__call__(message, context)
        if message.metadata.message_type == MessageType.TRAIN:
            reply.content[keys.METRICS][keys.STEPS] = self.steps
        return reply


def _old_recurrence() -> list[list[np.ndarray]]:
    """The former ``fednova.server-momentum``: the model after each round, float64."""
    x, v, models = [a.astype(np.float64) for a in X0], None, []
    n = np.array([s[0] for s in SITES], dtype=np.float64)
    p = n / n.sum()
    a = np.array([max(steps, 0.5 * TAU) for _, steps, _ in SITES])  # the a-norm floor
    for _ in range(ROUNDS):
        deltas = [_local_delta([w.astype(np.float32) for w in x], optimum)
                  for *_, optimum in SITES]
        tau_eff = float(p @ a)
        big_delta = [tau_eff * sum(p[i] * deltas[i][j] / a[i] for i in range(len(SITES)))
                     for j in range(len(x))]
        v = big_delta if v is None else [BETA * vj + dj for vj, dj in zip(v, big_delta)]
        x = [xj - vj for xj, vj in zip(x, v)]
        models.append(x)
    return models


def test_fednova_with_avgm_walks_the_former_server_momentum_sequence():
    config = RunConfig.from_mapping({
        "strategy.aggregator": "fednova", "optimizer": "sgd", "momentum": 0.0,
        "strategy.server-opt": "avgm", "server-opt.momentum": BETA,
        "strategy.defence": "none", "local-steps": TAU, "min-nodes": len(SITES),
        "node-wait-timeout": 5, "fraction-evaluate": 0.0})
    strategy = build_strategy(config)
    sites = [_Site(f"site-{i}", n, steps, optimum)
             for i, (n, steps, optimum) in enumerate(SITES)]
    result = strategy.start(
        grid=InProcessGrid([VirtualSite({"site-name": s.name}, s) for s in sites], run_id=42),
        initial_arrays=ArrayRecord({k: Array(v) for k, v in zip(["w", "b"], X0)}),
        num_rounds=ROUNDS)
    got = [*sites[0].seen[1:], result.arrays.to_numpy_ndarrays()]  # after rounds 1..3
    assert len(got) == ROUNDS
    for ours, theirs in zip(got, _old_recurrence()):
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert strategy.reports[1].strategy["a-norm-floored/site-2"] == pytest.approx(2.0)


@pytest.mark.parametrize("value", [0.0, 0.9])
def test_the_retired_key_is_refused_naming_its_replacement(value):
    with pytest.raises(PluginError, match="'fednova.server-momentum' was retired: .*"
                                          "strategy.server-opt = \"avgm\" and "
                                          "server-opt.momentum = <beta>"):
        RunConfig.from_mapping({"strategy.aggregator": "fednova", "optimizer": "sgd",
                                "fednova.server-momentum": value})
