"""Wiring test of ``bench/gpu.py --quick`` (CPU, tiny sizes): the JSON's shape and its ratios.

The 512 px PE preset is the one row that runs every part (trainer vs bare AMP, DP-SGD vs
plain, the 3-site federation, structured pruning), so CI runs that preset only; its numbers
are no GPU result and no threshold is asserted on them.
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

import pytest


def _load():
    return importlib.import_module("gpu")


def _positive_finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_quick_run_writes_every_ratio(tmp_path: Path) -> None:
    bench = _load()
    output = tmp_path / "gpu.json"
    assert bench.main(["--quick", "--device", "cpu", "--presets", "pe-seg-clinical",
                       "--output", str(output)]) == 0
    report = json.loads(output.read_text())
    assert report["device"].startswith("cpu") and report["quick"] is True
    (run,) = report["runs"]
    assert run["preset"] == "pe-seg-clinical" and run["task"] == "pe-seg"
    for key in ("ours_over_bare_amp", "dp_over_plain", "round_over_training",
                "structured_pruning_speedup", "seconds_per_step"):
        assert _positive_finite(run[key]), (key, run[key])
    assert run["gpu_memory_gib"] is None  # CPU: no GPU memory to report
    federation = run["federation"]
    assert federation["sites"] == 3 and len(federation["per_round"]) == 1
    assert all(r["sites_train_seconds"] > 0 for r in federation["per_round"])
    assert run["settings"]["image-size"] == 32  # --quick's sizes, not the preset's 512 px


def test_presets_are_the_clinical_configs() -> None:
    bench = _load()
    for name in bench.PRESETS:
        values = bench.preset_values(name)
        assert values["task"] in name
        assert bench.preset_values(name, quick=True)["image-size"] <= 32


def test_bad_preset_is_refused() -> None:
    with pytest.raises(ValueError, match="bench/gpu.py: no preset"):
        _load().preset_values("no-such-preset")
