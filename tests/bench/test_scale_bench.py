"""The scale benchmark's parts: linked site folders and the process-tree memory sampler."""

from __future__ import annotations

import importlib
import subprocess
import sys
import time

from app.tooling.process_tree import descendants, stop_pids
from clients.cxr_cls.manifest import read_manifest


def _load():
    return importlib.import_module("scale")


def test_site_folders_link_every_site_to_one_of_the_distinct_ones(tmp_path):
    root = _load().site_folders(tmp_path, sites=5, distinct=2)
    names = sorted(p.name for p in root.iterdir())
    assert names == [f"hospital-{i:02d}" for i in range(5)]
    assert (root / "hospital-04").resolve() == (tmp_path / "base-2" / "hospital-00").resolve()
    assert (root / "hospital-03").resolve() == (tmp_path / "base-2" / "hospital-01").resolve()
    assert len(read_manifest(root / "hospital-03")) == 12  # 8 + 4 test images


def test_sampler_sums_the_tree_and_finds_the_simulation_process(tmp_path):
    script = tmp_path / "flwr-simulation"  # named like Flower's engine, holding 64 MB
    script.write_text("import time\nblock = b'x' * (64 << 20)\ntime.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
                               f"subprocess.run([sys.executable, {str(script)!r}])"])
    sampler = _load().MemorySampler(parent.pid, interval=0.1)
    try:
        for _ in range(200):
            sampler.sample()
            if sampler.server_peak_kib >= 64 * 1024:
                break
            time.sleep(0.1)
    finally:
        children = descendants(parent.pid)
        parent.kill()
        parent.wait(timeout=10)
        stop_pids(children, timeout=0.1)
    assert sampler.server_seen
    assert sampler.server_peak_kib >= 64 * 1024
    assert sampler.total_rss_peak_kib > sampler.server_peak_kib
    assert sampler.total_pss_peak_kib >= 64 * 1024


def test_stage_seconds_split_rounds_two_on_into_train_and_the_rest():
    log = [f"11/24/2026 00:{m:02d}:{sec:02d}:INFO:{what}\n" for m, sec, what in (
        (0, 0, "configure_train: 10 sites"), (0, 9, "aggregate_train: 10 accepted"),
        (0, 30, "Round 1/3: train loss"), (0, 30, "configure_train: 10 sites"),
        (0, 34, "aggregate_train: 10 accepted"), (1, 10, "Round 2/3: train loss"),
        (1, 10, "configure_train: 10 sites"), (1, 12, "aggregate_train: 10 accepted"),
        (1, 50, "Round 3/3: train loss"))]
    assert _load().stage_seconds(["noise\n", *log]) == {"train_stage_s": [4, 2],
                                                        "evaluate_stage_s": [36, 38]}


def test_a_point_replaces_only_the_same_configuration():
    scale = _load()
    old = {"sites": 100, "selected": 10, "evaluated": 10}
    assert scale._identity(dict(old, seconds_per_round=2.0)) == scale._identity(old)
    assert scale._identity(dict(old, defence="none")) != scale._identity(old)
    assert scale._identity(dict(old, selected=100)) != scale._identity(old)
    assert scale._identity({"sites": 100, "selected": 10}) == (100, 100, 10, "")
