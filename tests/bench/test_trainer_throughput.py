"""Wiring test of ``bench/trainer_throughput.py`` on one tiny model (CPU, a few steps).

A tiny synthetic CXR hospital (32 px), the small DenseNet, batch 2, 2 steps x 1 repeat:
our trainer and the bare loop must do the same number of steps and samples, and
the result must be JSON-able with the ratio ours / bare.
"""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import asdict

import pytest
import torch

from clients.cxr_cls.synthetic import generate_federation as generate_cxr_federation
from clients.registry import task_class
from clients.training.trainer import select_device
from clients.training.site_task import TaskSettings



def _load():
    return importlib.import_module("trainer_throughput")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("cxr")
    return generate_cxr_federation(root, num_sites=1, seed=0, image_size=32)[0]


def test_measure_model_same_work_and_ratio(site):
    bench = _load()
    task = task_class("cxr-cls")(site, TaskSettings(image_size=32, batch_size=2,
                                                    model_size="small"))
    threads = torch.get_num_threads()
    result = bench.measure_model(task, "cxr-cls", select_device("cpu"), threads,
                                 repeats=1, steps=2, min_steps=1)
    assert result.steps == 2
    assert result.ours.steps == result.bare.steps == 2
    assert result.ours.samples == result.bare.samples == 2 * 2
    assert result.ours.samples_per_s > 0 and result.bare.samples_per_s > 0
    # One pair: the median-of-pairs ratio is that pair's ratio = the ratio of the rates.
    assert math.isclose(result.ratio, result.ours.samples_per_s / result.bare.samples_per_s)
    assert math.isclose(result.ratio, result.ratio_of_medians)
    assert result.cpu_ratio > 0 and result.best_ratio > 0
    assert len(result.ours.seconds) == len(result.bare.cpu_seconds) == 1
    payload = json.loads(json.dumps(asdict(result)))
    assert payload["model"] == "cxr-cls" and payload["device"] == "cpu"
    assert payload["ratio"] > 0 and payload["batch"] == 2
    assert "| cxr-cls | cpu |" in bench.markdown_table([result])


def test_loops_see_cycled_epochs(site):
    """More steps than one epoch of batches: both loops restart the loader and agree."""
    bench = _load()
    task = task_class("cxr-cls")(site, TaskSettings(image_size=32, batch_size=16,
                                                    model_size="small"))
    per_epoch = len(task._train_loader(0, select_device("cpu")))
    steps = per_epoch + 1
    ours = bench.run_ours(task, steps, select_device("cpu"))
    bare = bench.run_bare(task, steps, torch.device("cpu"))
    assert ours[:2] == bare[:2] == (steps, steps * 16)
    assert ours[2] > 0 and bare[3] > 0
