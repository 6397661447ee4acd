"""Wiring test of ``bench/privacy_utility.py --quick`` (skipped without the shared data)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import torch

SHARED = Path("/work/shared/data")


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("privacy_utility")


def test_quick_run_writes_the_issue_format(bench, tmp_path):
    if not (SHARED / "cxr2d" / "pneumoniamnist_balanced.npz").is_file():
        pytest.skip(f"shared data not found under {SHARED}")
    threads = torch.get_num_threads()
    try:
        out = tmp_path / "privacy_utility.json"
        assert bench.main(["--quick", "--sets", "pneumoniamnist", "--epsilons", "8", "inf",
                           "--shared", str(SHARED), "--output", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    result = json.loads(out.read_text())
    runs = {r["epsilon"]: r for r in result["runs"]}
    assert set(runs) == {None, 8.0}
    assert runs[None]["relative_to_nonprivate"] == 1.0
    assert 0.0 <= runs[8.0]["metric"] <= 1.0
    assert all(e <= 8.0 + 1e-6 for e in runs[8.0]["epsilon_spent"])  # the accountant's own
    (rate,) = result["throughput"]
    assert rate["task"] == "cxr-cls" and rate["dp_over_plain"] > 0
    assert rate["grad_sample_mode"] == "hooks"
    assert rate["dp_over_plain_by_mode"]["hooks"] == rate["dp_over_plain"]
    assert set(rate["dp_over_plain_by_mode"]) == {"hooks", "functorch"}
