"""Issue 29, found 5: one site's self-reported metric cannot pick the best round.

``val-auc`` reported as 0.70, 0.72 and 1e6 aggregated (example-weighted) to
333,333.8, so one site chose the round registered ``<experiment>-best``. Under
the default (``best-round.aggregate = "auto"``: the paired site vote, issue 50,
item 5; before, the median of the sites' values behind a defence) a site reporting
in-range but extreme values (0.99 against the honest 0.70 / 0.72 of a bad round)
cannot pick the round.
"""

from __future__ import annotations

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from app.config.run_config import RunConfig, RunConfigError
from app.engine import VirtualSite, run_federation
from app.server_app import RoundRecorder
from app.tracking import BestRound
from app.tracking.best_round import score_rule
from strategies.rounds.round_report import RoundReport
from strategies.robust import site_median, site_trimmed_mean
from tests.app.test_best_round import _arrays, _recorder
from tests.fixtures.scripted_site import ScriptedSite


def _round(server_round: int, values: dict[str, float]) -> RoundReport:
    """A round the sites scored ``values`` (``val-auc``), each with 100 examples."""
    mean = sum(values.values()) / len(values)
    return RoundReport(server_round, evaluate_aggregate={"val-auc": mean},
                       evaluate={site: {"val-auc": v} for site, v in values.items()})


# Round 1 is good (honest 0.85 / 0.86); round 2 is bad (honest 0.70 / 0.72) but the
# attacker reports 0.99 in it and 0.0 in the good one.
ROUNDS = [{"site-a": 0.85, "site-b": 0.86, "site-x": 0.0},
          {"site-a": 0.70, "site-b": 0.72, "site-x": 0.99}]


def _best_round(tmp_path, best: BestRound) -> int:
    recorder = _recorder(tmp_path, best)
    for server_round, values in enumerate(ROUNDS, start=1):
        recorder(_round(server_round, values), _arrays(server_round))
    return best.round


def test_the_default_run_config_selects_by_the_site_vote(tmp_path):
    """The product's defaults select round 1: round 2 is worse at both honest sites."""
    config = RunConfig.from_mapping({})
    rule = score_rule(config.best_round_aggregate)
    best = BestRound("val-auc", aggregate=rule)
    assert rule == "site-vote" and _best_round(tmp_path, best) == 1
    # the logged best-val-auc is round 1's own value, as its round line prints it
    assert best.value == pytest.approx((0.85 + 0.86 + 0.0) / 3)


@pytest.mark.parametrize("rule", ["median", "trimmed-mean", "site-vote"])
def test_the_robust_rules_keep_the_liar_from_picking_the_round(tmp_path, rule):
    assert _best_round(tmp_path, BestRound("val-auc", aggregate=rule)) == 1


def test_the_mean_lets_one_site_pick_the_round(tmp_path):
    """The example-weighted mean, still a choice: the attacker picks."""
    assert _best_round(tmp_path, BestRound("val-auc", aggregate="mean")) == 2


def test_auto_is_the_site_vote_and_the_other_choices_are_themselves():
    assert score_rule("auto") == "site-vote"
    for choice in ("mean", "median", "trimmed-mean", "site-vote"):
        assert score_rule(choice) == choice


def test_the_robust_rules_on_the_sites_values():
    assert site_median([0.70, 0.72, 1e6]) == pytest.approx(0.72)
    assert site_median([0.6, 0.8]) == pytest.approx(0.7)
    # one value cut at each end from 3 sites, 2 from 10 (20 %); none from 2
    assert site_trimmed_mean([0.70, 0.72, 1e6]) == pytest.approx(0.72)
    assert site_trimmed_mean([0.6, 0.8]) == pytest.approx(0.7)
    ten = [0.7] * 8 + [1e6, -1e6]
    assert site_trimmed_mean(ten) == pytest.approx(0.7)


def test_a_site_without_the_metric_or_with_a_non_finite_value_does_not_vote(tmp_path):
    best = BestRound("val-auc", aggregate="median")
    report = RoundReport(1, evaluate={"site-a": {"val-auc": 0.6}, "site-b": {"val-loss": 0.3},
                                      "site-c": {"val-auc": float("nan")}})
    assert best.observe(1, report.evaluate_aggregate, report.evaluate, ["w"], [np.zeros(1)])
    assert (best.value, best.sites) == (0.6, ["site-a", "site-b", "site-c"])
    assert not best.observe(2, {}, {"site-b": {"val-loss": 0.3}}, ["w"], [np.zeros(1)])


def test_the_best_round_aggregate_run_config_key():
    assert RunConfig.from_mapping({}).best_round_aggregate == "auto"
    config = RunConfig.from_mapping({"best-round.aggregate": "trimmed-mean"})
    assert config.as_params()["best-round.aggregate"] == "trimmed-mean"
    with pytest.raises(RunConfigError, match="'best-round.aggregate' must be one of"):
        RunConfig.from_mapping({"best-round.aggregate": "max"})


def _scripted(name: str, values: list[float]) -> ScriptedSite:
    """A site reporting ``values[r - 1]`` as round r's ``val-dice`` (then 0.5 on test)."""
    answers = iter(values)

    def evaluate(weights) -> dict[str, float]:
        return {"val-dice": next(answers, 0.5), "test-dice": 0.5}

    return ScriptedSite(name, evaluate=evaluate)


@pytest.mark.parametrize("aggregate, selected", [("auto", 1), ("mean", 2)])
def test_through_the_server_app_one_site_cannot_pick_the_registered_best_round(
        tmp_path, mlflow_store, aggregate, selected):
    """The product's defaults (norm-bound, ``auto``): round 1 is registered ``-best``."""
    store = mlflow_store(tmp_path / "store")
    sites = [_scripted("site-a", [0.85, 0.70]), _scripted("site-b", [0.86, 0.72]),
             _scripted("site-x", [0.0, 0.99])]
    outcome = run_federation({
        "num-server-rounds": 2, "image-size": 16, "node-wait-timeout": 5,
        "best-round.aggregate": aggregate, "experiment": "robust", "tracking-uri": store,
        "artifact-root": str(tmp_path / "artifacts"),
        "checkpoint-dir": str(tmp_path / "checkpoints")},
        [VirtualSite({}, site) for site in sites])
    assert outcome.best_round == selected
    client = MlflowClient(store)
    assert client.get_model_version("robust-best", "1").tags["round"] == str(selected)
    run = client.get_run(outcome.mlflow_run_id)
    assert run.data.tags["selection-aggregate"] == {"auto": "site-vote",
                                                    "mean": "mean"}[aggregate]
    # the best value is the selected round's own val-dice (its round line's)
    assert run.data.metrics["best-val-dice"] == pytest.approx(
        {"auto": (0.85 + 0.86 + 0.0) / 3, "mean": (0.70 + 0.72 + 0.99) / 3}[aggregate])
