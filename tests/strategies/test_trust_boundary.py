"""The server's trust boundary in the round loop (issue #12).

Self-reported sizes are capped, a site cannot pose as another, a reply the
aggregator rejects is dropped (never the run), a non-finite new model is never
kept, and ``fraction-train`` holds whatever ``min-nodes`` is. FedNova's a-norm
from a site is ignored: see ``tests/strategies/test_server_a_norm.py``.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, MessageType

from strategies.aggregation import AggregationError, fedavg_delta
from strategies.plugins.run_settings import RunSettings
from strategies.plugins.selectors.options import SelectionOptions
from strategies.wire import message_keys as keys
from strategies.wire.errors import ReplyError
from strategies.plugins.registries import (AGGREGATORS, SCHEDULES, SELECTORS,
                                           SERVER_OPTIMIZERS, build)
from strategies.rounds.federated_strategy import FederatedStrategy
from strategies.rounds.site_book import SiteBook
from tests.strategies.scripted_grid import connected, flower_round, scripted_grid
from tests.strategies.test_federated_strategy import (
    GLOBAL,
    _global_record,
    _reply,
    _train_metrics,
    make_strategy,
)

pytestmark = pytest.mark.usefixtures("server_identity")


def _round(strategy: FederatedStrategy, server_round: int, nodes: list[int],
           answers: dict[int, tuple[list[np.ndarray], dict, str]],
           arrays: ArrayRecord | None = None):
    """A train round on ``nodes``; ``answers[node] = (delta, metrics, site)``, the others
    never answer."""
    grid = scripted_grid({node: partial(_answer, answer=answer)
                          for node, answer in answers.items()},
                         silent=[node for node in nodes if node not in answers])
    return flower_round(strategy, server_round, grid, arrays or _global_record())


def _answer(message, answer: tuple[list[np.ndarray], dict, str]):
    return _reply(message, *answer)


def _delta(value: float) -> list[np.ndarray]:
    return [np.full(2, value, np.float32), np.full((1, 1), value, np.float32),
            np.array(0, np.int64)]


# ------------------------------------------------------------- num-examples cap
def test_a_site_cannot_inflate_its_examples_after_joining():
    strategy = make_strategy(min_nodes=2)
    _round(strategy, 1, [8, 2], {8: (_delta(0.0), _train_metrics(10), "a"),
                                 2: (_delta(0.0), _train_metrics(10), "b")})
    arrays, metrics = _round(strategy, 2, [8, 2], {
        8: (_delta(1.0), _train_metrics(10), "a"),
        2: (_delta(-1.0), _train_metrics(10**15), "b")})
    # weighted as its first declaration (10): the mean of +1 and -1, not b's update
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], GLOBAL[0])
    assert metrics[keys.NUM_EXAMPLES] == 20.0
    assert strategy.reports[2].train["b"][keys.NUM_EXAMPLES] == 10.0


def test_the_size_cap_survives_a_checkpoint_and_a_smaller_size_is_used():
    book = SiteBook()
    book.learn(1, "a", num_examples=10)
    book = SiteBook.restore(book.snapshot())
    assert book.capped(1, 10**15) == 10
    assert book.capped(1, 4) == 4
    assert book.sizes == {1: 10}


# --------------------------------------------------------------------- identity
def test_a_site_cannot_pose_as_another():
    strategy = make_strategy(min_nodes=2)
    _round(strategy, 1, [8, 2, 3], {8: (_delta(0.0), _train_metrics(10), "a"),
                                    2: (_delta(0.0), _train_metrics(10), "b")})
    _round(strategy, 2, [8, 2, 3], {
        8: (_delta(0.0), _train_metrics(10), "a"),
        2: (_delta(5.0), _train_metrics(10), "a"),     # node of b declares a
        3: (_delta(5.0), _train_metrics(10), "a")})    # new node claims a's name
    report = strategy.reports[2]
    assert list(report.train) == ["a"]
    assert "node 2 is bound to site 'b'" in report.train_dropped["b"]
    assert "bound to node 8" in report.train_dropped["node-3"]
    assert strategy.sites.names == {8: "a", 2: "b"}


def test_a_name_moves_to_a_new_node_only_when_its_node_is_gone():
    strategy = make_strategy(min_nodes=1)
    _round(strategy, 1, [8, 2], {8: (_delta(0.0), _train_metrics(10), "a"),
                                 2: (_delta(0.0), _train_metrics(10), "b")})
    # a's SuperNode restarted under node id 7: the name, and its size cap, move
    _round(strategy, 2, [2, 7], {2: (_delta(0.0), _train_metrics(10), "b"),
                                 7: (_delta(0.0), _train_metrics(10**9), "a")})
    assert sorted(strategy.reports[2].train) == ["a", "b"]
    assert strategy.reports[2].train_dropped == {}
    assert strategy.sites.names == {2: "b", 7: "a"}
    assert strategy.reports[2].train["a"][keys.NUM_EXAMPLES] == 10.0


def test_times_selected_are_tracked_under_site_names_from_the_first_round():
    strategy = make_strategy(min_nodes=2)
    _round(strategy, 1, [4, 5], {4: (_delta(0.0), _train_metrics(10), "a"),
                                 5: (_delta(0.0), _train_metrics(10), "b")})
    assert strategy.reports[1].times_selected == {"a": 1.0, "b": 1.0}
    assert strategy.reports[1].selection["selected"] == ["a", "b"]


# --------------------------------------------------------- aggregation failures
class _Refusing:
    """An aggregator that rejects the reply of site ``bad`` (or, ``bad=None``, all)."""

    needs_all_updates = True

    def __init__(self, bad: str | None) -> None:
        self.bad = bad

    def aggregate(self, replies):
        sites = [r.site for r in replies]
        if self.bad is None:
            raise ReplyError("rule needs more replies")
        if self.bad in sites:
            raise AggregationError("weight out of range", index=sites.index(self.bad))
        return AGGREGATORS.create("fedavg").aggregate(replies)


def test_a_reply_the_aggregator_rejects_is_dropped_not_the_run():
    strategy = make_strategy(min_nodes=2)
    strategy.train.aggregator = _Refusing("b")
    arrays, _ = _round(strategy, 1, [8, 2], {8: (_delta(1.0), _train_metrics(10), "a"),
                                             2: (_delta(9.0), _train_metrics(10), "b")})
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], GLOBAL[0] - 1.0)
    report = strategy.reports[1]
    assert list(report.train) == ["a"]
    assert report.train_dropped["b"] == "rejected by the aggregation: weight out of range"
    assert report.aggregation_failed == ""


def test_an_unattributable_aggregation_failure_keeps_the_model():
    strategy = make_strategy(min_nodes=2)
    strategy.train.aggregator = _Refusing(None)
    assert _round(strategy, 1, [8, 2], {8: (_delta(1.0), _train_metrics(10), "a"),
                                        2: (_delta(9.0), _train_metrics(10), "b")}) == (
        None, None)
    assert strategy.reports[1].aggregation_failed == (
        "aggregation failed: rule needs more replies")


def test_fedavg_names_the_update_at_fault():
    with pytest.raises(AggregationError) as info:
        AGGREGATORS.create("fedavg").aggregate([])
    assert info.value.index is None
    with pytest.raises(AggregationError) as info:
        fedavg_delta([_delta(0.0), _delta(1.0)], [3, 0])
    assert info.value.index == 1


@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_a_non_finite_new_model_is_never_kept(momentum):
    """FedNova scales a 1-step site's finite float32 update by tau_eff / 1: it overflows.

    The server optimizer's state (FedAvgM's velocity) is rolled back with the model.
    """
    strategy = make_strategy(min_nodes=2, aggregator="fednova")
    strategy.train.aggregator = AGGREGATORS.create(  # a 1-step site counts as 1 step of 8
        "fednova", min_steps_fraction=0.125)
    strategy.train.server_opt = SERVER_OPTIMIZERS.create("avgm", momentum=momentum)
    huge = _delta(-2e38)
    arrays, metrics = _round(strategy, 1, [8, 2], {
        8: (huge, _train_metrics(10, steps=1), "a"),
        2: (_delta(0.0), _train_metrics(10, steps=8), "b")})
    assert (arrays, metrics) == (None, None)
    report = strategy.reports[1]
    assert "is not finite; the previous model is kept" in report.aggregation_failed
    # the run goes on: the next round starts from the old model
    arrays, _ = _round(strategy, 2, [8, 2], {8: (_delta(1.0), _train_metrics(10, steps=8), "a"),
                                             2: (_delta(1.0), _train_metrics(10, steps=8), "b")})
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], GLOBAL[0] - 1.0)


# -------------------------------------------------------------- fraction-train
def _settings(fraction: float, min_nodes: int) -> RunSettings:
    return RunSettings(local_steps=2, num_rounds=3, fraction_train=fraction,
                       min_nodes=min_nodes, seed=0, optimizer="sgd")


@pytest.mark.parametrize("selector", ["uniform", "rpow-d"])
def test_fraction_train_holds_when_min_nodes_is_every_site(selector):
    nodes = list(range(2, 102))
    strategy = FederatedStrategy(
        aggregator=AGGREGATORS.create("fedavg"), schedule=SCHEDULES.create("fixed", tau0=2),
        selector=build(SELECTORS, selector, {"selection": SelectionOptions()},
                                 _settings(0.1, 100)),
        min_nodes=100, fraction_evaluate=0.1, node_wait_timeout=1)
    messages = list(strategy.configure_train(1, _global_record(), ConfigRecord(),
                                             connected(nodes)))
    assert len(messages) == 10
    assert all(m.metadata.message_type == MessageType.TRAIN for m in messages)
    evaluate = list(strategy.configure_evaluate(1, _global_record(), ConfigRecord(),
                                                connected(nodes)))
    assert len(evaluate) == 10


def test_fraction_evaluate_samples_afresh_each_round_and_reproducibly():
    """Not always the first sites: a seeded sample per round, every site gets its turn."""
    nodes = list(range(2, 102))

    def evaluated(seed: int, server_round: int) -> list[int]:
        strategy = FederatedStrategy(
            aggregator=AGGREGATORS.create("fedavg"), schedule=SCHEDULES.create("fixed", tau0=2),
            selector=build(SELECTORS, "uniform", {"selection": SelectionOptions()},
                                     _settings(0.1, 100)),
            min_nodes=100, fraction_evaluate=0.1, node_wait_timeout=1, seed=seed)
        return [m.metadata.dst_node_id for m in strategy.configure_evaluate(
            server_round, _global_record(), ConfigRecord(), connected(nodes))]

    first, second = evaluated(0, 1), evaluated(0, 2)
    assert len(first) == len(second) == 10 and first != second
    assert first != list(range(2, 12))
    assert evaluated(0, 1) == first and evaluated(1, 1) != first
