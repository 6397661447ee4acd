"""The attack benchmark through the product (``bench/robustness.py --quick``): a tiny federation
of the real ServerApp and ClientApp per (defence, attack); schema, merge and the effect it shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
needs_data = pytest.mark.skipif(
    not (SHARED / "cxr2d" / "pneumoniamnist_balanced.npz").is_file(),
    reason="needs the shared data folder (../shared/data)")

SET = "pneumoniamnist-quick"
OTHER = {"clean": {"another-set": 2.0},
         "runs": [{"set": "another-set", "attack": "none", "defence": "fedavg",
                   "metric": 2.0, "relative_to_clean": 1.0}],
         "sets": {"another-set": {"metric_name": "loss", "direction": "lower is better"}}}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    import robustness

    tmp = tmp_path_factory.mktemp("robustness")
    path = tmp / "robustness.json"
    path.write_text(json.dumps(OTHER))
    assert robustness.main(["--quick", "--output", str(path), "--workdir", str(tmp)]) == 0
    return json.loads(path.read_text())  # strict JSON: a run without a finite AUC is null


def run(report: dict, defence: str, attack: str) -> dict:
    (found,) = [r for r in report["runs"]
                if (r["set"], r["defence"], r["attack"]) == (SET, defence, attack)]
    return found


@needs_data
def test_the_set_is_merged_beside_the_others_with_the_schema_of_the_issue(report):
    import robustness

    quick = robustness.QUICK[SET]
    assert report["clean"]["another-set"] == 2.0
    assert [r for r in report["runs"] if r["set"] == "another-set"] == OTHER["runs"]
    assert report["engine"] == "in-process"
    entry = report["sets"][SET]
    assert entry["direction"] == "higher is better" and "val-auc" in entry["metric_name"]
    assert entry["setup"]["sites"] == 3 and entry["setup"]["rounds"] == quick["rounds"]
    pairs = {(r["defence"], r["attack"]) for r in report["runs"] if r["set"] == SET}
    assert pairs == {(d, a) for d in quick["defences"] for a in quick["attacks"]}
    for found in (r for r in report["runs"] if r["set"] == SET):
        assert found["attacker"] in found["final_site_val_auc"]
        assert len(found["val_auc_per_round"]) == quick["rounds"]
        if found["metric"] is not None:
            assert 0.0 <= found["metric"] <= 1.0
            assert found["relative_to_clean"] == pytest.approx(
                found["metric"] / report["clean"][SET])
    assert run(report, "fedavg", "none")["relative_to_clean"] == 1.0


@needs_data
def test_a_boosted_update_hurts_fedavg_more_than_norm_bound_at_three_sites(report):
    scaled_fedavg = run(report, "fedavg", "scaled")["relative_to_clean"]
    scaled_bound = run(report, "norm-bound", "scaled")["relative_to_clean"]
    assert scaled_bound is not None
    assert scaled_fedavg is None or scaled_fedavg < scaled_bound - 0.05
    # nobody attacks: the norm bound leaves the honest updates as they are
    assert run(report, "norm-bound", "none")["metric"] == pytest.approx(
        run(report, "fedavg", "none")["metric"], rel=1e-6)


def test_the_metric_leaves_the_attackers_own_validation_split_out():
    from robustness import honest_auc

    final = {"a": [0.9, 100.0], "b": [0.6, 300.0], "bad": [0.1, 1000.0]}
    assert honest_auc(final, "bad") == pytest.approx((0.9 * 100 + 0.6 * 300) / 400)
    assert honest_auc({**final, "b": [None, 300.0]}, "bad") is None


def test_a_merge_replaces_only_the_sets_it_brings(tmp_path):
    from robustness import merge_report

    path = tmp_path / "r.json"
    row = {"set": "a", "attack": "none", "defence": "fedavg", "metric": 1.0,
           "relative_to_clean": 1.0}
    merge_report(path, {"clean": {"a": 1.0, "b": 2.0}, "runs": [row, {**row, "set": "b"}],
                        "sets": {"a": {}, "b": {}}, "engine": "in-process"})
    merged = merge_report(path, {"clean": {"b": 3.0}, "runs": [{**row, "set": "b", "metric": 3.0}],
                                 "sets": {"b": {"direction": "higher"}}})
    assert merged["clean"] == {"a": 1.0, "b": 3.0}
    assert [(r["set"], r["metric"]) for r in merged["runs"]] == [("a", 1.0), ("b", 3.0)]
    assert merged["sets"] == {"a": {}, "b": {"direction": "higher"}}
    assert merged["engine"] == "in-process"
