"""The vertical benchmark through the product (``bench/vertical.py --quick``): one tiny pvFed
federation on Cleveland's departments and one round of FedAvg, vanilla and U-shaped split
learning on PneumoniaMNIST; the issue's schema and what each row must hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
pytestmark = pytest.mark.skipif(
    not (SHARED / "cxr2d" / "pneumoniamnist_balanced.npz").is_file()
    or not (SHARED / "tabular" / "heart_disease").is_dir(),
    reason="needs the shared data folder (../shared/data)")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    import vertical

    tmp = tmp_path_factory.mktemp("vertical-bench")
    path = tmp / "vertical.json"
    assert vertical.main(["--quick", "--output", str(path), "--workdir", str(tmp)]) == 0
    return json.loads(path.read_text())


def test_pvfed_rows_have_the_issue_fields_per_department_and_method(report):
    rows = report["pvfed"]
    assert {(r["department"], r["method"]) for r in rows} == {
        (d, m) for d in ("clinic", "stress-lab", "cath-lab") for m in ("local-best", "pvfed-pca")}
    for row in rows:
        assert {"set", "department", "method", "metric", "mean", "sd", "seeds"} <= set(row)
        assert row["set"] == "heart-disease" and row["seeds"] == 1
        assert 0.0 <= row["mean"] <= 1.0 and row["sd"] is None  # one seed: no sd


def test_split_rows_compare_fedavg_and_both_split_variants_with_bytes_and_time(report):
    rows = {r["method"]: r for r in report["split"]}
    assert set(rows) == {"fedavg", "splitnn", "splitnn-u"}
    for row in rows.values():
        assert {"set", "method", "metric", "bytes", "seconds"} <= set(row)
        assert 0.0 <= row["metric"] <= 1.0 and row["bytes"] > 0 and row["seconds"] > 0
    # U-shaped: the middle's outputs come back and their gradients go up, on top of vanilla's
    assert rows["splitnn-u"]["bytes"] > rows["splitnn"]["bytes"]


def test_label_dp_rows_give_the_attack_and_the_auc_per_epsilon(report):
    """Issue #46: without label DP the gradient attack reads (nearly) every label; at
    epsilon = 1 it is right about as often as randomised response keeps a label."""
    rows = {r["epsilon"]: r for r in report["label_dp"]}
    assert set(rows) == {None, 1.0}
    for row in rows.values():
        assert {"set", "method", "epsilon", "keep_probability", "attack_accuracy", "metric",
                "seconds", "seeds"} <= set(row)
        assert row["method"] == "splitnn-u" and 0.0 <= row["metric"] <= 1.0
    assert rows[None]["attack_accuracy"] >= 0.95 and rows[None]["keep_probability"] == 1.0
    assert rows[1.0]["attack_accuracy"] <= rows[1.0]["keep_probability"] + 0.15
