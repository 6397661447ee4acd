"""``bench/stats.py``: its examples, and the summaries it now computes recompute the stored
results in ``bench/results/`` from their per-seed values (no benchmark is rerun)."""

from __future__ import annotations

import doctest
import json
import math
from pathlib import Path

import pytest

import stats

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def _stored(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def _close(ours, stored) -> bool:
    """Equal, floats to 1e-9 relative (a sum's last bits), through dicts and lists."""
    if isinstance(ours, dict) and isinstance(stored, dict):
        return ours.keys() == stored.keys() and all(_close(ours[k], stored[k]) for k in ours)
    if isinstance(ours, list | tuple) and isinstance(stored, list | tuple):
        return len(ours) == len(stored) and all(map(_close, ours, stored))
    if isinstance(ours, float) and isinstance(stored, float):
        return math.isclose(ours, stored, rel_tol=1e-9, abs_tol=1e-12) or ours == stored or (
            math.isnan(ours) and math.isnan(stored))
    return ours == stored


def test_the_examples_hold():
    assert doctest.testmod(stats).failed == 0


def test_one_seed_has_no_sd_and_a_missing_value_no_mean():
    assert stats.mean_sd([0.7]) == (0.7, None)
    assert stats.mean_sd([0.7, None]) == (None, None)
    assert stats.mean_sd(stats.defined([0.7, None, 0.9]))[0] == pytest.approx(0.8)
    assert stats.sd([0.5, 0.5, 0.5]) == 0.0  # a measured spread of zero
    assert stats.pm(0.7, None, ".2f") == "0.70" and stats.pm(None, None, ".2f") == "n/a"


def test_pruning_and_bytes_to_target_summaries_recompute_the_stored_ones():
    from bytes_to_target import compare, summarise as bytes_summary
    from pruning_summary import compare_seeds, summarise

    pruning = _stored("pruning")
    setup = pruning["meta"]["setup"]
    assert _close(summarise(compare_seeds(pruning["per_seed"], setup["tail"],
                                          setup["fraction"])), pruning["runs"])
    target = _stored("compression_to_target")
    runs = compare(target["runs"], target["setup"]["tail"], target["setup"]["fraction"])
    assert _close(bytes_summary(runs), target["summary"])


def test_per_seed_summaries_recompute_the_stored_ones():
    from personalisation_summary import summarise as personal
    from server_optimizers import summarise as server

    kept = _stored("personalisation")
    for name, records in kept["per_seed"].items():
        rows = [r for r in kept["runs"] if r["set"] == name]
        metrics = tuple(dict.fromkeys([rows[0]["metric"], *rows[0]["metrics"]]))
        assert _close(personal(name, metrics, records), rows)
    tuned = _stored("server_optimizers")
    rows = [row for name, entry in tuned["sets"].items() for row in server(
        name, entry["metric"], tuned["per_seed"], tuned["protocol"]["fraction"])]
    assert _close(rows, tuned["runs"])


def test_mean_and_sd_recompute_the_stored_rows_of_the_other_benchmarks():
    privacy = _stored("privacy_utility")
    for row in privacy["summary"]:
        group = [r for r in privacy["runs"] if (r["set"], r["epsilon"]) == (row["set"],
                                                                           row["epsilon"])]
        assert _close(stats.mean_sd(r["metric"] for r in group),
                      (row["metric"], row["metric_sd"]))
    vertical = _stored("vertical")
    for row in vertical["pvfed"] + vertical["split"]:
        if row["values"]:
            assert _close(stats.mean_sd(row["values"]), (row.get("mean", row["metric"]), row["sd"]))
    for arm in ("plain", "secagg"):
        kept = _stored("secure_aggregation")["accuracy"][arm]
        assert _close(stats.mean_sd(kept["values"]), (kept["mean"], kept["sd"]))
    for method in _stored("selection_powd")["summary"].values():
        assert _close(stats.sd(method["final_accuracy_per_seed"]), method["final_accuracy_std"])
