"""The default norm-bound holds for any number of sites (#29, found 1).

Found item: "The default defence does nothing with 2 sites. norm-bound with kappa 3
clips each update to kappa times the round's median norm. With two sites that
median is half the attacker's own norm, so the clip factor is 1.0. A x1000 update
moved the global model by 184.7 against an honest update norm of 0.37."

The bound is now kappa x the LOWER median of the round's norms and, from round 2
on, at most ``norm-bound.history-kappa`` x the median of the norms accepted in the
last ``norm-bound.history-rounds`` rounds.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord

from app.config.run_config import RunConfig
from app.engine import InProcessGrid, VirtualSite
from app.engine.attacks import SiteAttack, attacking_site
from app.server_app import build_strategy
from strategies.aggregation import RunningSum
from strategies.rounds.update_stream import DefendedAggregator
from strategies.plugins.defences.norm_bound import NormBoundDefence, NormBoundOptions
from strategies.rounds.reply_intake import TrainReply
from strategies.wire.plugin_options import PluginError
from strategies.rounds.checkpoint import (CHECKPOINT_FILE, ServerCheckpoint, load_checkpoint,
                                          run_folder, save_checkpoint)
from tests.fixtures.scripted_site import ScriptedSite

pytestmark = pytest.mark.usefixtures("server_identity")  # run 42, the SuperLink's node 1

INITIAL = [np.zeros(4, np.float32), np.array(0, np.int64)]
HONEST_NORM = 2.0  # ||ones(4)||: every scripted site's update
#: The defaults: norm-bound.kappa and norm-bound.history-kappa.
KAPPA, HISTORY_KAPPA = 1.5, 3.0


def _default_aggregator() -> DefendedAggregator:
    """The aggregator the product builds from the default run config (norm-bound + FedAvg)."""
    aggregator = build_strategy(RunConfig()).aggregator
    assert isinstance(aggregator, DefendedAggregator)
    assert isinstance(aggregator.defence, NormBoundDefence)
    return aggregator


def _reply(i: int, scale: float = 1.0, n: int = 10) -> TrainReply:
    return TrainReply(node_id=i, site=f"site-{i}",
                      delta=[np.full(4, scale, np.float32), np.array(-1, np.int64)],
                      num_examples=n, steps=1, train_loss=1.0, a_norm=1.0)


def test_two_sites_in_the_engine_the_default_defence_bounds_a_boosted_update():
    sites = [VirtualSite({"site-name": f"site-{i}"}, ScriptedSite(f"site-{i}", num_examples=10))
             for i in range(2)]
    sites[0] = attacking_site(sites[0], SiteAttack(scale=1000.0))
    strategy = build_strategy(RunConfig.from_mapping({"min-nodes": 2, "node-wait-timeout": 5}))
    result = strategy.start(grid=InProcessGrid(sites, run_id=42),
                            initial_arrays=ArrayRecord(INITIAL), num_rounds=1)
    weights = result.arrays.to_numpy_ndarrays()[0]
    # the bound is kappa (KAPPA = 1.5) x the lower median norm (the honest one): the attacker counts 1.5
    np.testing.assert_allclose(weights, np.full(4, (KAPPA + 1.0) / 2), rtol=1e-5)
    info = strategy.reports[1].strategy
    assert info["norm-bound"] == pytest.approx(KAPPA * HONEST_NORM, rel=1e-6)
    assert info["clip-factor/site-0"] == pytest.approx(KAPPA / 1000.0, rel=1e-5)
    assert info["clip-factor/site-1"] == 1.0


@pytest.mark.parametrize("sites", [2, 3, 10])
def test_a_boosted_update_moves_the_model_at_most_kappa_honest_norms(sites: int):
    replies = [_reply(0, 1000.0), *(_reply(i) for i in range(1, sites))]
    delta, info = _default_aggregator().aggregate(replies)
    clean = np.ones(4)
    moved = float(np.linalg.norm(delta[0] - clean))
    # the attacker's weight 1/sites times at most kappa x the honest norm (plus its own)
    assert moved <= (KAPPA + 1.0) * HONEST_NORM / sites + 1e-5
    assert info["norm-bound"] == pytest.approx(KAPPA * HONEST_NORM, rel=1e-6)


def test_the_smaller_of_two_sites_cannot_raise_the_bound():
    delta, info = _default_aggregator().aggregate([_reply(0, 0.001), _reply(1)])
    assert info["norm-bound"] == pytest.approx(KAPPA * 0.001 * HONEST_NORM, rel=1e-5)
    assert float(np.linalg.norm(delta[0])) <= KAPPA * 0.001 * HONEST_NORM + 1e-6


def test_a_site_alone_in_a_later_round_is_bounded_by_the_history():
    aggregator = _default_aggregator()
    aggregator.aggregate([_reply(0), _reply(1)])  # round 1: honest, norms 2
    delta, info = aggregator.aggregate([_reply(0, 1000.0)])  # round 2: one site, x1000
    assert info["norm-bound-reference"] == pytest.approx(HONEST_NORM)
    assert info["norm-bound"] == pytest.approx(HISTORY_KAPPA * HONEST_NORM)
    assert float(np.linalg.norm(delta[0])) == pytest.approx(HISTORY_KAPPA * HONEST_NORM, rel=1e-5)


def test_the_history_keeps_the_accepted_norms_of_the_last_rounds_only():
    defence = NormBoundDefence(kappa=3.0, history_kappa=2.0, history_rounds=2)
    aggregator = DefendedAggregator(defence, _default_aggregator().aggregator)
    for scale in (1.0, 1.0, 0.1, 0.1):  # honest updates shrink over training
        aggregator.aggregate([_reply(0, scale), _reply(1, scale)])
    np.testing.assert_allclose(defence.history, [[0.2, 0.2], [0.2, 0.2]], rtol=1e-6)
    _, info = aggregator.aggregate([_reply(0, 1.0), _reply(1, 1.0)])
    assert info["norm-bound"] == pytest.approx(2.0 * 0.1 * HONEST_NORM, rel=1e-5)


def test_the_streaming_fold_learns_the_history_at_the_round_end():
    defence = NormBoundDefence(absolute=100.0, kappa=0.0)
    aggregator = DefendedAggregator(defence, _default_aggregator().aggregator)
    assert not aggregator.needs_all_updates
    for round_scales in ((1.0, 1.0), (1000.0, 1.0)):
        total = RunningSum(INITIAL)
        replies = [_reply(i, s) for i, s in enumerate(round_scales)]
        infos = [aggregator.fold(total, r, i) for i, r in enumerate(replies)]
        delta, _ = aggregator.finish(total, replies)
    np.testing.assert_allclose(defence.history, [[HONEST_NORM, HONEST_NORM],
                                                 [HISTORY_KAPPA * HONEST_NORM, HONEST_NORM]], rtol=1e-6)
    assert infos[0]["clip-factor/site-0"] == pytest.approx(HISTORY_KAPPA / 1000.0)
    np.testing.assert_allclose(delta[0], np.full(4, 2.0), rtol=1e-5)


def _engine_round(strategy, weights: list[np.ndarray], deltas: list[float], server_round=1):
    """One round of ``strategy`` on sites whose updates are ``delta`` x ones (engine)."""
    sites = [VirtualSite({"site-name": f"site-{i}"},
                         ScriptedSite(f"site-{i}", num_examples=10,
                                      delta=lambda w, d=d: [np.full_like(w[0], d),
                                                            np.zeros_like(w[1])]))
             for i, d in enumerate(deltas)]
    return strategy.start(grid=InProcessGrid(sites, run_id=42),
                          initial_arrays=ArrayRecord(weights), num_rounds=1)


def test_the_history_resumes_from_the_strategys_checkpoint(tmp_path):
    config = RunConfig.from_mapping({"min-nodes": 2, "node-wait-timeout": 5,
                                     "checkpoint-dir": str(tmp_path)})
    running = build_strategy(config, federation="fed")
    _engine_round(running, INITIAL, [1.0, 1.0])
    assert running.train.aggregator.defence.history == [[HONEST_NORM, HONEST_NORM]]
    path = run_folder(tmp_path, "fed") / CHECKPOINT_FILE
    save_checkpoint(path, ServerCheckpoint(server_round=1, keys=["w", "n"], arrays=INITIAL,
                                           strategy=running.snapshot(), mlflow_run_id="fed",
                                           run_config=config.as_params()))
    resumed = build_strategy(config, federation="fed")
    resumed.restore(load_checkpoint(path, {**config.as_params(), "resume": True},
                                    template=resumed.snapshot()).strategy)
    assert resumed.train.aggregator.defence.history == [[HONEST_NORM, HONEST_NORM]]
    _, info = resumed.train.aggregator.aggregate([_reply(0, 1000.0)])  # one site, round 2
    assert info["norm-bound"] == pytest.approx(HISTORY_KAPPA * HONEST_NORM)


def test_a_round_whose_new_model_is_refused_teaches_the_history_nothing():
    strategy = build_strategy(RunConfig.from_mapping({"min-nodes": 2,
                                                      "node-wait-timeout": 5}))
    huge = [np.full(4, -2e38, np.float32), np.array(0, np.int64)]
    _engine_round(strategy, huge, [2e38, 2e38])  # x - Delta overflows float32: refused
    assert "not finite" in strategy.reports[1].aggregation_failed
    assert strategy.train.aggregator.defence.history == []


def test_the_history_options_are_checked_naming_the_key():
    with pytest.raises(PluginError, match="'norm-bound.history-kappa' must be 0"):
        NormBoundOptions(history_kappa=0.5)
    with pytest.raises(PluginError, match="'norm-bound.history-rounds'"):
        NormBoundOptions(history_rounds=0)
    assert NormBoundDefence(history_kappa=0.0).bound.history_kappa is None
