"""The SecAgg+ benchmark through the product (``bench/secure_aggregation.py --quick``): tiny
federations of the real ServerApp and ClientApp, plain and secure; the issue's schema, the
bit-for-bit sum, the drop-out survived and the uplink ratios."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
needs_data = pytest.mark.skipif(
    not (SHARED / "cxr2d" / "pneumoniamnist_balanced.npz").is_file(),
    reason="needs the shared data folder (../shared/data)")

FIELDS = {"sites", "dropout", "round_seconds_plain", "round_seconds_secagg", "bytes_up_plain",
          "bytes_up_secagg", "sum_exact", "metric_plain", "metric_secagg"}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    import secure_aggregation

    tmp = tmp_path_factory.mktemp("secagg-bench")
    path = tmp / "secure_aggregation.json"
    assert secure_aggregation.main(["--quick", "--output", str(path),
                                    "--workdir", str(tmp)]) == 0
    return json.loads(path.read_text())


@needs_data
def test_every_run_has_the_issue_fields_and_an_exact_unmasked_sum(report):
    import secure_aggregation

    quick = secure_aggregation.QUICK
    runs = report["runs"]
    assert [(r["sites"], r["dropout"], r["codec"]) for r in runs] == [
        *((quick["sites"][0], d, "none") for d in quick["dropouts"]),
        (quick["randk_sites"], 0.0, quick["randk"]), (quick["randk_sites"], 0.0, "none")]
    assert runs[-1]["local_steps"] == quick["long_steps"]
    for run in runs:
        assert FIELDS <= set(run)
        assert run["sum_exact"] is True and run["rounds_unmasked"] == quick["rounds"]
        assert run["failed_secagg"] is None and run["aggregation_failed_secagg"] == []
        assert 0.0 <= run["metric_secagg"] <= 1.0 and 0.0 <= run["metric_plain"] <= 1.0


@needs_data
def test_a_dropout_after_the_masked_input_is_survived_and_the_uplink_is_bounded(report):
    dense, dropped, randk, _ = report["runs"]
    assert dropped["dropouts"] == 1 and dropped["dropped_secagg"] == ["hospital-00"]
    # 4 sites, b = 20: 22 bits of 32 per value plus the other stages' replies
    assert 22 / 32 < dense["bytes_ratio_to_dense_fp32"] <= 1.25
    assert randk["bytes_ratio_to_dense_fp32"] <= 0.25
    assert report["accuracy"]["secagg"]["values"] and report["accuracy"]["plain"]["values"]
    timing = report["timing"]
    assert len(timing["round_seconds"]["plain"]) == len(timing["round_seconds"]["secagg"]) == 1
    assert timing["ratio"] == timing["median_secagg"] / timing["median_plain"] > 0
