"""``bench/local_fedavg_pooled.py``: the pooled site folder holds every site's items, and the
three regimes run through the product (in-process engine) on tiny PneumoniaMNIST sites with
the same total optimiser steps (skipped without ``../shared/data``)."""

from __future__ import annotations

import csv
import importlib
import json
import math
from pathlib import Path

import pytest

bench = importlib.import_module("local_fedavg_pooled")
sites = importlib.import_module("federation_sites")

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
CXR = SHARED / "cxr2d" / "pneumoniamnist_balanced.npz"
MSD = SHARED / "seg2d" / "msd_lung_tumour_patches_val.npz"


def _rows(folder: Path, index: str) -> list[dict]:
    with (folder / index).open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize(("task", "args", "index", "data", "source"), [
    ("cxr-cls", ["--scheme", "dirichlet"], "images.csv", "images", CXR),
    ("pe-seg", ["--set", "msd-lung", "--scheme", "size"], "manifest.csv", "studies", MSD)])
def test_the_pooled_folder_holds_every_item_of_every_site(tmp_path, task, args, index, data,
                                                          source):
    if not source.is_file():
        pytest.skip(f"{source} absent")
    folders = sites.convert_shared(task, SHARED, tmp_path / "sites",
                                   [*args, "--sites", "2", "--max-per-site", "12"])
    pooled = sites.pooled_folder(folders, tmp_path / "pooled")
    rows = _rows(pooled, index)
    assert rows == [r for f in folders for r in _rows(f, index)]  # splits kept
    assert sorted(p.name for p in (pooled / data).iterdir()) == sorted(
        p.name for f in folders for p in (f / data).iterdir())


def test_steps_must_split_evenly(tmp_path):
    with pytest.raises(ValueError, match="multiple"):
        bench.compare([tmp_path / "a", tmp_path / "b"], tmp_path / "p",
                      bench.ENTRIES["cxr-cls"], bench.Budget(steps_total=7, rounds=2), tmp_path)


@pytest.mark.skipif(not CXR.is_file(), reason=f"{CXR} absent")
def test_three_regimes_through_the_product_with_the_same_steps(tmp_path):
    out = tmp_path / "local_fedavg_pooled.json"
    assert bench.main(["--tasks", "cxr-cls", "--sites", "2", "--max-per-site", "16",
                       "--steps", "4", "--rounds", "1", "--output", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert payload["engine"] == "in-process"
    result = payload["results"]["cxr-cls"]
    regimes = result["regimes"]
    assert {regimes[name]["steps_done"] for name in bench.REGIMES} == {4}
    assert regimes["local"]["steps_per_site"] == 2 and len(regimes["local"]["models"]) == 2
    assert regimes["fedavg"]["rounds"] * regimes["fedavg"]["local_steps"] * 2 == 4
    assert regimes["pooled"]["num_train"] == sum(regimes["fedavg"]["num_examples"].values())
    # the measuring sites refuse training by their site policy, named in the dropped reply
    assert sorted(regimes["pooled"]["refused"]) == ["hospital-00", "hospital-01"]
    assert all("min-local-steps" in why for why in regimes["pooled"]["refused"].values())
    for name in bench.REGIMES:
        mean = result["summary"][name]
        assert 0.0 <= mean["accuracy"] <= 1.0
        assert math.isnan(mean["auc"]) or 0.0 <= mean["auc"] <= 1.0
    # the site-alone models differ, and so do the regimes' models
    first, second = (m["per_site"]["hospital-00"]["loss"] for m in regimes["local"]["models"])
    assert first != second
    assert result["summary"]["fedavg"]["loss"] != result["summary"]["pooled"]["loss"]
    assert "FedAvg" in bench.markdown("cxr-cls", result)
