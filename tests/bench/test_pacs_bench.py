"""``bench/pacs.py --quick`` against a real Orthanc: the JSON has issue 48's shape, the round trip holds.

Skips without Debian's Orthanc or dciodvfy, fails under CI (which installs both).
"""

from __future__ import annotations

import importlib
import json

import pytest

from tests.debian_tools import debian_tool
from tests.pacs.conftest import require_orthanc

RUN_KEYS = {"transport", "studies", "mb_per_s", "limit_mb_per_s", "ratio", "incremental_fraction"}


def test_the_quick_bench_writes_the_issues_shape(tmp_path):
    require_orthanc()
    debian_tool("dciodvfy", "dicom3tools", "the PACS bench checks the DICOM results")
    out = tmp_path / "pacs.json"
    assert importlib.import_module("pacs").main(["--quick", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["round_trip_valid"] is True
    assert [(run["transport"], run["image_size"], run["studies"]) for run in report["runs"]] == [
        ("dicomweb", 32, 6), ("dimse", 32, 6), ("dicomweb", 128, 2), ("dimse", 128, 2)]
    for run in report["runs"]:
        assert RUN_KEYS <= set(run)
        assert run["mb_per_s"] > 0 and run["limit_mb_per_s"] > 0
        assert run["ratio"] == pytest.approx(run["mb_per_s"] / run["limit_mb_per_s"], rel=0.05, abs=0.002)
        assert 0 < run["incremental_fraction"] < 1
