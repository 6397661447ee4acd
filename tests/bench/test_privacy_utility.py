"""``bench/privacy_utility.py --quick`` through the product (in-process engine): the noise
multiplier for a target epsilon, the sites' own ledgers staying within it, the issue's JSON
format (skipped without the shared data)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"

bench = importlib.import_module("privacy_utility")


def test_the_noise_grows_as_epsilon_shrinks_and_with_the_smallest_site():
    loose, tight = (bench.noise_for(eps, [400, 900], 64, 40) for eps in (8.0, 1.0))
    assert 0 < loose < tight
    assert bench.noise_for(8.0, [400, 900], 64, 40) == bench.noise_for(8.0, [400], 64, 40)
    assert bench.noise_for(8.0, [900], 64, 40) < loose  # a larger site samples less often


def test_quick_run_writes_the_issue_format(tmp_path):
    if not (SHARED / "cxr2d" / "pneumoniamnist_balanced.npz").is_file():
        pytest.skip(f"shared data not found under {SHARED}")
    out = tmp_path / "privacy_utility.json"
    assert bench.main(["--quick", "--sets", "pneumoniamnist", "--epsilons", "8", "inf",
                       "--throughput-tasks", "cxr-cls",
                       "--shared", str(SHARED), "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["engine"] == "in-process" and result["config"]["rounds"] == 1
    runs = {r["epsilon"]: r for r in result["runs"]}
    assert set(runs) == {None, 8.0}
    assert runs[None]["relative_to_nonprivate"] == 1.0 and runs[None]["noise_multiplier"] == 0
    assert runs[8.0]["noise_multiplier"] > 0 and 0.0 <= runs[8.0]["metric"] <= 1.0
    assert runs[None]["epsilon_spent"] == [None, None, None]  # no DP, no ledger
    spent = runs[8.0]["epsilon_spent"]  # each site's own privacy ledger
    assert len(spent) == 3 and all(0 < e <= 8.0 + 1e-6 for e in spent)
    assert runs[8.0]["train_sizes"] == runs[None]["train_sizes"]
    rates = result["throughput"]  # DP-SGD against plain training, per input size
    assert [(r["task"], r["settings"]["image_size"]) for r in rates] == [
        ("cxr-cls", 32), ("cxr-cls", 64)]
    for rate in rates:
        assert rate["dp_over_plain"] > 0 and rate["grad_sample_mode"] == "hooks"
        assert rate["dp_cost_x"] == pytest.approx(1 / rate["dp_over_plain"])  # one pair
