"""The real-data attack benchmark (``bench/robustness_real.py --quick``): schema, merge, effects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
pytestmark = pytest.mark.skipif(not (SHARED / "cxr2d" / "pneumoniamnist_balanced.npz").is_file(),
                                reason="needs the shared data folder (../shared/data)")

SET = "pneumoniamnist-dirichlet"
OTHER = {"clean": {"least-squares-sim": 2.0},
         "runs": [{"set": "least-squares-sim", "attack": "none", "defence": "fedavg",
                   "metric": 2.0, "relative_to_clean": 1.0}],
         "sets": {"least-squares-sim": {"metric_name": "loss", "direction": "lower is better"}}}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    import robustness_real

    path = tmp_path_factory.mktemp("robustness_real") / "robustness.json"
    path.write_text(json.dumps(OTHER))
    assert robustness_real.main(["--quick", "--output", str(path)]) == 0
    return json.loads(path.read_text())  # strict JSON: a diverged run is null, not NaN


def relative(report: dict, defence: str, attack: str) -> float | None:
    (run,) = [r for r in report["runs"]
              if (r["set"], r["defence"], r["attack"]) == (SET, defence, attack)]
    return run["relative_to_clean"]


def test_the_set_is_merged_beside_the_others_with_the_schema_of_the_issue(report):
    import robustness_real

    quick = robustness_real.QUICK[SET]
    assert report["clean"]["least-squares-sim"] == 2.0
    assert [r for r in report["runs"] if r["set"] == "least-squares-sim"] == OTHER["runs"]
    assert report["sets"][SET]["direction"] == "higher is better"
    assert "AUC" in report["sets"][SET]["metric_name"]
    pairs = {(r["defence"], r["attack"]) for r in report["runs"] if r["set"] == SET}
    assert pairs == {(d, a) for d in quick["defences"] for a in quick["attacks"]}
    for run in (r for r in report["runs"] if r["set"] == SET):
        if run["metric"] is not None:
            assert 0.0 <= run["metric"] <= 1.0
            assert run["relative_to_clean"] == pytest.approx(run["metric"] / report["clean"][SET])
    assert relative(report, "fedavg", "none") == 1.0


def test_a_scaled_update_hurts_fedavg_more_than_norm_bound(report):
    scaled_fedavg = relative(report, "fedavg", "scaled")
    scaled_bound = relative(report, "norm-bound", "scaled")
    assert scaled_bound is not None
    assert scaled_fedavg is None or scaled_fedavg < scaled_bound - 0.05

