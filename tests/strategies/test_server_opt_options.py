"""strategy.server-opt and its server-opt.* section: checked before anything runs, errors
naming the keys; composed with every aggregator and with secure aggregation; a refused
round keeps the optimizer's state."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from app.config.run_config import RunConfig
from app.engine import InProcessGrid, VirtualSite
from app.server_app import build_strategy
from strategies.plugins.registries import SERVER_OPTIMIZERS
from strategies.plugins.server_opt.adam import FedAdam
from strategies.plugins.server_opt.sgd import ServerSGD
from strategies.plugins.server_opt.yogi import FedYogi
from strategies.wire.plugin_options import PluginError
from tests.fixtures.scripted_site import ScriptedSite

pytestmark = pytest.mark.usefixtures("server_identity")  # run 42, the SuperLink's node 1


def test_the_default_is_sgd_with_flowers_defaults_for_the_others():
    assert isinstance(build_strategy(RunConfig()).train.server_opt, ServerSGD)
    etas = {name: build_strategy(RunConfig.from_mapping({"strategy.server-opt": name}))
            .train.server_opt.eta for name in SERVER_OPTIMIZERS.names()}
    assert etas == {"sgd": 1.0, "avgm": 1.0, "adagrad": 0.1, "adam": 0.1, "yogi": 0.01}
    yogi = build_strategy(RunConfig.from_mapping({"strategy.server-opt": "yogi",
                                                  "server-opt.eta": 0.03})).train.server_opt
    assert isinstance(yogi, FedYogi)
    assert (yogi.eta, yogi.beta1, yogi.beta2, yogi.tau) == (0.03, 0.9, 0.99, 1e-3)


@pytest.mark.parametrize(("values", "message"), [
    ({"server-opt.beta1": 1.0}, "'server-opt.beta1' must be a float in [0, 1)"),
    ({"server-opt.beta2": -0.1}, "'server-opt.beta2' must be a float in [0, 1)"),
    ({"server-opt.tau": 0.0}, "'server-opt.tau' must be > 0"),
    ({"server-opt.eta": -1.0}, "'server-opt.eta' must be a float >= 0"),
    ({"server-opt.momentum": 1.0}, "'server-opt.momentum' must be a float in [0, 1)"),
    ({"server-opt.lr": 0.1}, "unknown run config key 'server-opt.lr'"),
    ({"strategy.server-opt": "nadam"}, "'strategy.server-opt' must be one of"),
    ({"strategy.server-opt": "adam", "server-opt.momentum": 0.5},
     "'server-opt.momentum' is not read by strategy.server-opt = 'adam'"),
    ({"strategy.server-opt": "adagrad", "server-opt.beta2": 0.5},
     "'server-opt.beta2' is not read by strategy.server-opt = 'adagrad'"),
    ({"server-opt.tau": 0.01}, "'server-opt.tau' is not read by strategy.server-opt = 'sgd'"),
])
def test_bad_options_are_refused_naming_the_key(values, message):
    with pytest.raises(PluginError, match=message.replace("[", r"\[").replace(")", r"\)")):
        RunConfig.from_mapping(values)


def test_fednovas_former_server_momentum_is_refused_for_avgm():
    """One server momentum (#45): FedNova's is ``avgm``'s, with any aggregator."""
    with pytest.raises(PluginError, match="'fednova.server-momentum' was retired"):
        RunConfig.from_mapping({"strategy.aggregator": "fednova", "optimizer": "sgd",
                                "fednova.server-momentum": 0.5, "strategy.server-opt": "avgm"})
    optimizer = build_strategy(RunConfig.from_mapping({
        "strategy.aggregator": "fednova", "optimizer": "sgd", "strategy.server-opt": "avgm",
        "server-opt.momentum": 0.5})).train.server_opt
    assert (optimizer.eta, optimizer.momentum) == (1.0, 0.5)


def test_pruning_is_refused_with_an_adaptive_optimizer():
    with pytest.raises(PluginError, match="'strategy.server-opt' = 'adam' cannot run with "
                                          "'strategy.pruning' = 'prunefl'"):
        RunConfig.from_mapping({"strategy.server-opt": "adam", "strategy.pruning": "prunefl"})


@pytest.mark.parametrize("aggregator", ["fedavg", "fednova", "median", "trimmed-mean"])
def test_every_aggregator_composes_with_every_optimizer(aggregator):
    for name in SERVER_OPTIMIZERS.names():
        config = RunConfig.from_mapping({"strategy.aggregator": aggregator, "optimizer": "sgd",
                                         "strategy.server-opt": name})
        assert build_strategy(config).train.server_opt.rounds == 0


def test_secure_aggregation_is_accepted_the_optimizer_acting_on_the_unmasked_sum():
    config = RunConfig.from_mapping({"strategy.secure-aggregation": "secagg+",
                                     "strategy.defence": "none", "strategy.server-opt": "yogi"})
    strategy = build_strategy(config)
    assert strategy.secure is not None and isinstance(strategy.train.server_opt, FedYogi)


def _round(strategy, initial: list[np.ndarray], update: float):
    sites = [VirtualSite({"site-name": f"site-{i}"},
                         ScriptedSite(f"site-{i}", num_examples=10,
                                      delta=lambda w: [np.full_like(w[0], update),
                                                       np.full_like(w[1], 0.5),
                                                       np.zeros_like(w[2])]))
             for i in range(2)]
    arrays = ArrayRecord({k: Array(v) for k, v in
                          zip(["w", "bn.running_var", "bn.num_batches_tracked"], initial)})
    return strategy.start(grid=InProcessGrid(sites, run_id=42), initial_arrays=arrays,
                          num_rounds=1)


def _strategy(name: str, **options):
    values = {"min-nodes": 2, "node-wait-timeout": 5, "strategy.defence": "none",
              "strategy.server-opt": name, **{f"server-opt.{k}": v for k, v in options.items()}}
    return build_strategy(RunConfig.from_mapping(values))


def test_through_the_strategy_statistics_take_delta_and_parameters_the_optimizers_step():
    strategy = _strategy("adam")
    initial = [np.zeros(3, np.float32), np.ones(2, np.float32), np.array(4, np.int64)]
    result = _round(strategy, initial, update=0.2)
    w, var, count = result.arrays.to_numpy_ndarrays()
    # the paper's Delta_1 = -0.2: m_1 = 0.1 (-0.2) = -0.02, v_1 = 0.01 (0.04) = 0.0004,
    # x_1 = 0 + eta m_1 / (sqrt(v_1) + tau) = 0.1 (-0.02) / (0.02 + 0.001)
    np.testing.assert_allclose(w, np.full(3, 0.1 * -0.02 / 0.021, np.float32), rtol=1e-5)
    np.testing.assert_array_equal(var, np.full(2, 0.5, np.float32))  # 1 - 0.5: the plain Delta
    assert int(count) == 4
    optimizer = strategy.train.server_opt
    assert isinstance(optimizer, FedAdam) and optimizer.rounds == 1
    assert [m.shape for m in optimizer.m] == [(3,)]
    assert "server-opt" in strategy.snapshot()


def test_a_round_whose_new_model_is_refused_keeps_the_optimizers_state():
    strategy = _strategy("avgm", momentum=0.5)
    initial = [np.full(3, -2e38, np.float32), np.ones(2, np.float32), np.array(0, np.int64)]
    result = _round(strategy, initial, update=2e38)  # x - v = -4e38: not finite in float32
    assert "not finite" in strategy.reports[1].aggregation_failed
    np.testing.assert_array_equal(result.arrays.to_numpy_ndarrays()[0], initial[0])
    assert strategy.train.server_opt.velocity is None and strategy.train.server_opt.rounds == 0
