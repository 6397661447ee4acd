"""Issue 50, item 5: the best-round rule picks the round the hospitals would pick.

Under the old default (``best-round.aggregate = auto`` = the sites' median behind the
default defence) the 4 heart-disease hospitals, one of whose validation AUC is
undefined, registered round 1 in 5 of 5 seeds: the median of 3 values is one
hospital's, and the median of a round with 3 values was compared with rounds of 4.
The default is now the paired site vote (:mod:`strategies.site_vote`): it compares a
round with the best so far on every site that scored both, and one lying site moves
one vote.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from app.config.run_config import RunConfig
from app.round_progress import metric_text
from app.tracking import BestRound
from app.tracking.best_round import score_rule
from strategies.rounds.round_report import RoundReport
from strategies.site_vote import site_vote
from tests.app.test_best_round import _arrays, _recorder

NAN = math.nan
HOSPITALS = ("cleveland", "hungary", "switzerland", "va")

#: Per round, each hospital's val-auc. Switzerland's is undefined in every round (its
#: validation rows hold one class); rounds 4-5 are better than round 1 at 2 of the 3
#: hospitals that score it, the median of 3 falls because Cleveland's fell below it.
UNDEFINED_THROUGHOUT = [(0.90, 0.80, NAN, 0.70), (0.85, 0.78, NAN, 0.72),
                        (0.80, 0.79, NAN, 0.74), (0.72, 0.84, NAN, 0.78),
                        (0.71, 0.85, NAN, 0.79)]
#: Switzerland reports no value in round 1 only: rounds 4-5 are better than round 1 at
#: all 3 of the 4 hospitals that scored round 1, but round 1's median (of 3) is compared
#: with medians of 4 that Switzerland's low values pull down.
UNDEFINED_IN_ROUND_ONE = [(0.80, 0.75, NAN, 0.60), (0.79, 0.74, 0.30, 0.62),
                          (0.79, 0.76, 0.31, 0.59), (0.82, 0.77, 0.35, 0.63),
                          (0.83, 0.78, 0.36, 0.64)]


def _round(server_round: int, values, examples=(100, 100, 100, 100)) -> RoundReport:
    """A round whose hospitals scored ``values`` (``val-auc``; NaN: none released), the
    aggregate example-weighted over the released ones, as the server computes it."""
    sites = {h: ({"val-auc": v} if not math.isnan(v) else {}) for h, v in zip(HOSPITALS, values)}
    pairs = [(v, n) for v, n in zip(values, examples) if not math.isnan(v)]
    mean = sum(v * n for v, n in pairs) / sum(n for _, n in pairs)
    return RoundReport(server_round, evaluate_aggregate={"val-auc": mean}, evaluate=sites)


def _selected(tmp_path, table, rule: str) -> BestRound:
    best = BestRound("val-auc", aggregate=rule)
    recorder = _recorder(tmp_path, best)
    for server_round, values in enumerate(table, start=1):
        recorder(_round(server_round, values), _arrays(server_round))
    return best


@pytest.mark.parametrize("table", [UNDEFINED_THROUGHOUT, UNDEFINED_IN_ROUND_ONE],
                         ids=["undefined-throughout", "undefined-in-round-1"])
def test_the_default_picks_the_later_rounds_the_hospitals_score_better(tmp_path, table):
    """The median of 3 picks round 1; the default picks round 5, better than round 1 and
    round 4 at most of the hospitals that scored both."""
    assert _selected(tmp_path / "median", table, "median").round == 1
    rule = score_rule(RunConfig.from_mapping({}).best_round_aggregate)
    best = _selected(tmp_path / "default", table, rule)
    assert best.round == 5
    for earlier in (1, 4):
        vote = site_vote(dict(zip(HOSPITALS, table[4])), dict(zip(HOSPITALS, table[earlier - 1])))
        assert vote.better > vote.worse


def test_every_honest_site_counts_not_one_hospitals_value():
    """Round 2 is better at 2 of 3 hospitals by a little, worse at one by much: the vote
    takes it, and each hospital's value takes part (the median of 3 is hungary's alone)."""
    best = BestRound("val-auc", aggregate="site-vote")
    rounds = [(0.70, 0.80, NAN, 0.90), (0.71, 0.81, NAN, 0.60)]
    for server_round, values in enumerate(rounds, start=1):
        report = _round(server_round, values)
        best.observe(server_round, report.evaluate_aggregate, report.evaluate, ["w"],
                     [np.zeros(1)])
    assert best.round == 2 and best.site_values == {"cleveland": 0.71, "hungary": 0.81,
                                                    "va": 0.60}


@pytest.mark.parametrize("lie", [1e6, 0.99, 1.5])
def test_a_lying_site_does_not_pick_the_model(tmp_path, caplog, lie):
    """Round 2 is worse at the 3 honest hospitals; the fourth reports ``lie`` in it and 0.0
    in round 1. A value out of range is left out with a warning naming the site."""
    rounds = [(0.85, 0.86, 0.84, 0.0), (0.70, 0.72, 0.71, lie)]
    best = BestRound("val-auc", aggregate="site-vote")
    recorder = _recorder(tmp_path, best)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        for server_round, values in enumerate(rounds, start=1):
            recorder(_round(server_round, values), _arrays(server_round))
    assert best.round == 1
    out_of_range = lie > 1
    assert ("round 2's value of site va left out" in caplog.text) is out_of_range


def test_an_in_range_liar_can_only_break_a_tie_of_the_honest_sites():
    """2 honest hospitals split (one better, one worse): the liar's vote decides, no more."""
    vote = site_vote({"a": 0.80, "b": 0.70, "x": 1.0}, {"a": 0.75, "b": 0.72, "x": 0.0})
    assert (vote.better, vote.worse, vote.sites, vote.wins) == (2, 1, 3, True)
    vote = site_vote({"a": 0.70, "b": 0.70, "x": 1.0}, {"a": 0.75, "b": 0.72, "x": 0.0})
    assert (vote.better, vote.worse, vote.wins) == (1, 2, False)


def test_rounds_are_compared_on_the_sites_that_scored_both():
    vote = site_vote({"a": 0.9, "b": NAN, "c": 0.1}, {"a": 0.8, "b": 0.5, "d": 0.99})
    assert (vote.better, vote.worse, vote.sites, vote.gain) == (1, 0, 1, pytest.approx(0.1))


def test_the_printed_best_value_is_the_rounds_and_names_its_rule(tmp_path, caplog):
    """The ``New best round`` line prints the round line's number and the rule; under the
    median, the median, labelled as such."""
    report = _round(1, UNDEFINED_THROUGHOUT[0], examples=(300, 100, 50, 100))
    for rule, value, label in [
            ("site-vote", report.evaluate_aggregate["val-auc"], "(the round's value); rule "
             "site-vote: the first round scored, at 3 sites"),
            ("median", 0.80, "(median of 3 sites)")]:
        best = BestRound("val-auc", aggregate=rule)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="flwr"):
            _recorder(tmp_path / rule, best)(report, _arrays(1))
        line = next(r.getMessage() for r in caplog.records
                    if r.getMessage().startswith("New best round"))
        assert line == f"New best round 1: val-auc {value:.4f} {label}"
    round_line = metric_text(report, "val-auc")
    assert round_line.startswith(f"val-auc {report.evaluate_aggregate['val-auc']:.4f} (")


def test_the_vote_against_the_best_is_named_on_the_line(tmp_path):
    best = _selected(tmp_path, UNDEFINED_IN_ROUND_ONE, "site-vote")
    value = _round(5, UNDEFINED_IN_ROUND_ONE[4]).evaluate_aggregate["val-auc"]
    assert best.line() == (
        f"New best round 5: val-auc {value:.4f}"
        " (the round's value); rule site-vote: better at 4, worse at 0 of the 4 sites that "
        "scored both it and round 4")


def test_the_checkpoint_keeps_the_best_rounds_site_values(tmp_path):
    best = _selected(tmp_path, UNDEFINED_THROUGHOUT[:4], "site-vote")
    resumed = BestRound("val-auc", aggregate="site-vote")
    resumed.restore(best.state())
    assert (resumed.round, resumed.site_values) == (4, best.site_values)
    report = _round(5, UNDEFINED_THROUGHOUT[4])
    assert resumed.observe(5, report.evaluate_aggregate, report.evaluate, ["w"], [np.zeros(1)])
