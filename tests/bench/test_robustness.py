"""The attack benchmark (``bench/robustness.py --quick``): schema and the effects it must show."""

from __future__ import annotations

import json

import pytest

import robustness


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("robustness") / "robustness.json"
    assert robustness.main(["--quick", "--output", str(path)]) == 0
    return json.loads(path.read_text())  # strict JSON: a diverged run is null, not NaN


def relative(report: dict, defence: str, attack: str) -> float | None:
    (run,) = [r for r in report["runs"] if (r["defence"], r["attack"]) == (defence, attack)]
    return run["relative_to_clean"]


def test_the_report_has_the_schema_of_the_issue(report):
    assert set(report["clean"]) == {robustness.SET}
    pairs = {(r["defence"], r["attack"]) for r in report["runs"]}
    assert pairs == {(d, a) for d in robustness.DEFENCES_RUN for a in robustness.ATTACKS}
    for run in report["runs"]:
        assert run["set"] == robustness.SET
        if run["metric"] is not None:
            assert run["relative_to_clean"] == pytest.approx(
                run["metric"] / report["clean"][robustness.SET])
    assert report["sets"][robustness.SET]["direction"] == "lower is better"
    assert relative(report, "fedavg", "none") == 1.0


def test_a_scaled_update_takes_fedavg_over_but_not_the_defences(report):
    assert relative(report, "fedavg", "scaled") > 1e3
    for defence in ("norm-bound", "multi-krum", "trimmed-mean", "median"):
        assert relative(report, defence, "scaled") < 2.0, defence


def test_non_finite_and_missing_replies_never_reach_the_aggregator(report):
    for defence in robustness.DEFENCES_RUN:
        assert relative(report, defence, "nan") == relative(report, defence, "always-fails")


def test_unweighted_rules_ignore_a_claimed_example_count(report):
    assert relative(report, "fedavg", "inflated-n") > 1.5
    for defence in ("trimmed-mean", "median"):
        assert relative(report, defence, "inflated-n") == relative(report, defence, "none")


def test_runs_are_deterministic_and_an_attack_changes_them():
    setup = {**robustness.QUICK, "rounds": 2}
    clean = robustness.run_federation("fedavg", "none", 0, setup)
    assert robustness.run_federation("fedavg", "none", 0, setup) == clean
    assert robustness.run_federation("fedavg", "sign-flip", 0, setup) != clean
