"""The coordinator's roster in the round loop (issue #12, item 1).

Without a roster a site that lies from its first reply keeps that weight and any
node may claim any free name; with one, only the roster's names reply and every
``num-examples`` is capped at the roster's size from round 1 on. Simulation
sites are named ``hospital-<partition-id>`` (two digits), as here.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from flwr.app import ConfigRecord

from strategies.rounds.federated_strategy import FederatedStrategy
from strategies.rounds.site_book import SiteBook
from strategies.wire import message_keys as keys
from tests.strategies.scripted_grid import scripted_grid
from tests.strategies.test_federated_strategy import GLOBAL, _global_record, _reply
from tests.strategies.test_federated_strategy import _train_metrics, make_strategy
from tests.strategies.test_trust_boundary import _delta, _round

pytestmark = pytest.mark.usefixtures("server_identity")

ROSTER = {"hospital-00": 10, "hospital-01": 10}


def _evaluate(strategy: FederatedStrategy, server_round: int, nodes: list[int],
              answers: dict[int, tuple[int, float, str]]):
    """An evaluate round on ``nodes``; ``answers[node] = (num-examples, val-dice, site)``."""
    grid = scripted_grid({node: partial(_answer, answer=answer)
                          for node, answer in answers.items()},
                         silent=[node for node in nodes if node not in answers])
    messages = strategy.configure_evaluate(server_round, _global_record(), ConfigRecord(), grid)
    return strategy.aggregate_evaluate(server_round, grid.send_and_receive(messages, timeout=5.0))


def _answer(message, answer: tuple[int, float, str]):
    count, dice, site = answer
    return _reply(message, None, {keys.NUM_EXAMPLES: count, "val-dice": dice}, site)


def test_a_site_lying_from_round_one_is_weighted_at_its_roster_size():
    answers = {8: (_delta(1.0), _train_metrics(10), "hospital-00"),
               2: (_delta(-1.0), _train_metrics(10**15), "hospital-01")}
    unregistered = make_strategy(min_nodes=2, max_size_ratio=0.0)
    arrays, _ = _round(unregistered, 1, [8, 2], answers)
    # without a roster or the relative cap (tests/strategies/test_size_ratio.py), the cap
    # is the first declaration: the liar is the global model
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], GLOBAL[0] + 1.0, rtol=1e-6)
    strategy = make_strategy(min_nodes=2, roster=ROSTER)
    arrays, metrics = _round(strategy, 1, [8, 2], answers)
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], GLOBAL[0])
    assert metrics[keys.NUM_EXAMPLES] == 20.0
    assert strategy.reports[1].train["hospital-01"][keys.NUM_EXAMPLES] == 10.0
    assert strategy.sites.sizes == {8: 10, 2: 10}


def test_an_honest_smaller_site_keeps_its_first_declaration_under_the_roster():
    strategy = make_strategy(min_nodes=2, roster={"hospital-00": 100, "hospital-01": 100})
    _round(strategy, 1, [8, 2], {8: (_delta(0.0), _train_metrics(10), "hospital-00"),
                                 2: (_delta(0.0), _train_metrics(30), "hospital-01")})
    _, metrics = _round(strategy, 2, [8, 2], {
        8: (_delta(0.0), _train_metrics(10), "hospital-00"),
        2: (_delta(0.0), _train_metrics(90), "hospital-01")})  # within the roster, not its first
    assert metrics[keys.NUM_EXAMPLES] == 40.0
    assert strategy.sites.sizes == {8: 10, 2: 30}


def test_a_name_not_on_the_roster_is_dropped_naming_the_rule():
    strategy = make_strategy(min_nodes=2, roster=ROSTER)
    arrays, _ = _round(strategy, 1, [8, 2, 3], {
        8: (_delta(1.0), _train_metrics(10), "hospital-00"),
        2: (_delta(1.0), _train_metrics(10), "hospital-01"),
        3: (_delta(-50.0), _train_metrics(10), "mallory")})
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], GLOBAL[0] - 1.0)
    report = strategy.reports[1]
    assert sorted(report.train) == ["hospital-00", "hospital-01"]
    # recorded under its node, not under the name it made up
    assert report.train_dropped == {
        "node-3": "site roster: site 'mallory' (node 3) is not on the coordinator's "
                  "roster (run config 'federation.roster')"}
    assert 3 not in strategy.sites.names


def test_without_a_roster_any_free_name_may_join():
    strategy = make_strategy(min_nodes=1)
    _round(strategy, 1, [3], {3: (_delta(0.0), _train_metrics(10), "mallory")})
    assert strategy.sites.names == {3: "mallory"}
    assert strategy.reports[1].train_dropped == {}


def test_evaluate_replies_are_capped_at_the_roster_and_off_roster_names_dropped():
    strategy = make_strategy(min_nodes=2, roster=ROSTER)
    metrics = _evaluate(strategy, 1, [8, 2, 3], {8: (10, 1.0, "hospital-00"),
                                                 2: (10**15, 0.0, "hospital-01"),
                                                 3: (10, 0.0, "mallory")})
    assert metrics["val-dice"] == pytest.approx(0.5)
    assert metrics[keys.NUM_EXAMPLES] == 20.0
    assert "not on the coordinator's roster" in strategy.reports[1].evaluate_dropped["node-3"]


def test_the_roster_holds_after_a_resume_and_over_an_older_checkpoint():
    """A checkpoint from a run without a roster: its caps are tightened to the roster."""
    book = SiteBook()
    book.learn(1, "hospital-00", num_examples=10**15)
    strategy = make_strategy(min_nodes=2, roster=ROSTER)
    strategy.restore({**strategy.snapshot(), **book.snapshot()})
    assert strategy.sites.roster == ROSTER
    assert strategy.sites.capped(1, 10**15) == 10
    assert strategy.sites.identity_problem(5, "mallory") is not None
