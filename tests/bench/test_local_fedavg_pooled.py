"""Wiring test of ``bench/local_fedavg_pooled.py`` on a tiny synthetic CXR federation.

Two synthetic hospitals (32 px), the small DenseNet, S_total = 4 steps: local,
FedAvg (1 round x 2 steps x 2 sites) and pooled must each do exactly S_total
optimiser steps, and every metric must lie in [0, 1] (AUC may be NaN only where a
site's validation split has a single class).
"""

from __future__ import annotations

import importlib
import json
import math

import pytest
import torch

from clients.cxr_cls.synthetic import generate_federation as generate_cxr_federation
from clients.pe_seg.synthetic import SiteProfile, generate_site
from clients.training.device import select_device
from clients.training.site_task import TaskSettings



@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("local_fedavg_pooled")


def _check_metrics(per_site):
    for site in per_site:
        assert 0.0 <= site["accuracy"] <= 1.0
        assert math.isnan(site["auc"]) or 0.0 <= site["auc"] <= 1.0


def test_three_regimes_same_steps(bench, tmp_path):
    torch.set_num_threads(1)
    generate_cxr_federation(tmp_path / "sites", num_sites=2, seed=0, image_size=32)
    tasks = bench.load_tasks("cxr-cls", tmp_path / "sites",
                             TaskSettings(image_size=32, batch_size=4))
    assert len(tasks) == 2
    cfg = bench.RunConfig(task="cxr-cls", steps_total=4, rounds=1, seed=0)
    result = bench.compare(tasks, cfg, select_device("cpu"))
    regimes = result["regimes"]

    assert {regimes[name]["steps_done"] for name in bench.REGIMES} == {4}
    assert regimes["local"]["steps_per_site"] == 2
    assert regimes["fedavg"]["rounds"] * regimes["fedavg"]["local_steps"] * len(tasks) == 4
    assert regimes["pooled"]["num_train"] == sum(len(t.train_set) for t in tasks)

    for model_eval in regimes["local"]["models"]:
        assert len(model_eval["per_site"]) == 2
        _check_metrics(model_eval["per_site"])
    _check_metrics(regimes["fedavg"]["per_site"])
    _check_metrics(regimes["pooled"]["per_site"])
    for name in bench.REGIMES:
        mean = result["summary"][name]
        assert 0.0 <= mean["accuracy"] <= 1.0
        assert math.isnan(mean["auc"]) or 0.0 <= mean["auc"] <= 1.0
    json.dumps(result)  # JSON-able
    assert "FedAvg" in bench.markdown("cxr-cls", result)


def test_steps_must_split_evenly(bench, tmp_path):
    with pytest.raises(ValueError, match="multiple"):
        bench.compare([object(), object()], bench.RunConfig("cxr-cls", steps_total=7, rounds=2),
                      select_device("cpu"))


def test_segmentation_regimes_report_dice(bench, tmp_path):
    """pe-seg: pooled training on the union of the sites' studies, Dice per regime."""
    torch.set_num_threads(1)
    profile = SiteProfile(name="h", num_studies=3, noise_hu=20.0, contrast_hu=200.0,
                              slice_thickness_mm=(2.0, 3.0), num_slices=(6, 8))
    for k in range(2):
        generate_site(tmp_path / "sites" / f"hospital-{k:02d}", profile, seed=k, image_size=32)
    tasks = bench.load_tasks("pe-seg", tmp_path / "sites",
                             TaskSettings(image_size=32, slab_slices=1, batch_size=2))
    pooled = bench.pooled_seg_task(tasks)
    assert len(pooled.train_set) == sum(len(t.train_set) for t in tasks)
    assert pooled.site_dir == tasks[0].site_dir and len(tasks[0].train_set) < len(pooled.train_set)

    result = bench.compare(tasks, bench.RunConfig(task="pe-seg", steps_total=4, rounds=1, seed=0),
                           select_device("cpu"))
    regimes = result["regimes"]
    assert {regimes[name]["steps_done"] for name in bench.REGIMES} == {4}
    assert regimes["pooled"]["num_train"] == len(pooled.train_set)
    for name in bench.REGIMES:
        assert set(result["summary"][name]) == {"dice", "loss"}
        assert 0.0 <= result["summary"][name]["dice"] <= 1.0
    assert "mean val Dice" in bench.markdown("pe-seg-ctpa", result)
    json.dumps(result)

    twice = bench.combine_repeats([result, result])
    assert twice["config"]["seeds"] == [0, 0] and len(twice["runs"]) == 2
    assert twice["summary"]["fedavg"]["dice"] == pytest.approx(result["summary"]["fedavg"]["dice"])
    assert twice["summary_sd"]["pooled"]["dice"] == pytest.approx(0.0)
    assert "+- 0.000" in bench.markdown("pe-seg-ctpa", twice)
