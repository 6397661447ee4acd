"""``bench/pneumoniamnist_preset.py``: the preset is a valid run config, the pooled test view is
MedMNIST's whole test split, and a ``--quick`` run through the product (in-process engine)
writes the issue's JSON (skipped without ``../shared/data``)."""

from __future__ import annotations

import importlib
import json
import tomllib
from pathlib import Path

import pytest

from app.engine import full_run_config

bench = importlib.import_module("pneumoniamnist_preset")

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
NEEDS_DATA = pytest.mark.skipif(not (SHARED / "cxr2d" / "pneumoniamnist_balanced.npz").is_file(),
                                reason="../shared/data/cxr2d/pneumoniamnist_balanced.npz absent")


def test_the_preset_is_a_cxr_cls_run_config_the_product_accepts() -> None:
    with bench.PRESET.open("rb") as handle:
        values = tomllib.load(handle)
    config = full_run_config(values)
    assert config["task"] == "cxr-cls" and config["image-size"] == values["image-size"]


def test_a_key_is_overridden_as_toml_else_as_text() -> None:
    assert bench._override("lr=0.001") == ("lr", 0.001)
    assert bench._override('optimizer="sgd"') == ("optimizer", "sgd")
    assert bench._override("augmentation=light") == ("augmentation", "light")


def test_earlier_runs_are_reused_only_under_the_same_settings(tmp_path) -> None:
    settings = {"task": "cxr-cls", "lr": 0.003}
    run = {"regime": "federated", "seed": 1, "test_auc": 0.9, "val_auc": 0.95}
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"settings": settings, "runs": [run, {**run, "val_auc": 0.1}],
                                   "quick": False}))
    assert bench.reused([earlier], dict(settings)) == [run]  # the first of a (regime, seed)
    with pytest.raises(ValueError, match="earlier.json: measured with other settings"):
        bench.reused([earlier], {**settings, "lr": 0.01})


@NEEDS_DATA
def test_the_pooled_test_view_holds_the_whole_medmnist_test_split(tmp_path) -> None:
    sites, pooled, test = bench.build_nodes(SHARED, tmp_path)
    assert len(sites) == 3
    assert bench.split_count(pooled, "test") == 468 == bench.split_count(test, "val")
    assert bench.split_count(pooled, "val") == sum(bench.split_count(s, "val") for s in sites)
    assert bench.split_count(test, "test") == 0
    assert sum(bench.split_count(s, "test") for s in sites) == 468


@NEEDS_DATA
def test_quick_run_writes_both_regimes(tmp_path) -> None:
    out = tmp_path / "preset.json"
    report = bench.main(["--quick", "--output", str(out), "--set", "augmentation=light"])
    assert json.loads(out.read_text()) == report
    assert [(r["regime"], r["seed"]) for r in report["runs"]] == [("federated", 0), ("pooled", 0)]
    federated, pooled = report["runs"]
    assert pooled["local_steps"] == 3 * federated["local_steps"] == 3 * bench.QUICK["local-steps"]
    for run in report["runs"]:
        assert set(run) >= {"regime", "seed", "test_auc", "val_auc", "wall_seconds"}
        assert 0.0 <= run["test_auc"] <= 1.0 and 0.0 <= run["val_auc"] <= 1.0
    assert report["mean"] == federated["test_auc"] and report["sd"] is None
    assert report["pooled_mean"] == pooled["test_auc"] and report["pooled_sd"] is None
    assert report["target"] == 0.962 and report["reached"] == (report["mean"] >= 0.962)
    assert report["settings"]["augmentation"] == "light" and report["quick"] is True
