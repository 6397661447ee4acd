"""Quick mode of ``bench/compression_to_target.py``: 2 rounds, 2 sites, random 28 px images.

Checks the JSON shape of issue 17 item 4, that the ratios come from the real
payloads (dense is exactly 1, top-k sends fewer bytes; the compressed
downlink's first round is a dense snapshot, then far smaller steps that every
site reconstructs bit for bit), and the convergence and bytes-to-target rules.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord

import compression_to_target as bench
from bytes_to_target import compare, flattened, goals, summarise
from compression_loop import parse_config
from downlink_sites import SiteDownlink
from strategies.model_packing import pack_arrays
from strategies.rounds.instructions import Uplink
from strategies.wire_bytes import wire_size

CONFIGS = ["none", "topk:0.01+ef", "topk:0.01+ef down=topk:0.01 warmup=1"]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("to-target")
    rng = np.random.default_rng(0)
    np.savez(tmp / "pneumonia.npz",
             train_images=rng.integers(0, 256, (120, 28, 28), dtype=np.uint8),
             train_labels=rng.integers(0, 2, (120, 1)),
             val_images=rng.integers(0, 256, (8, 28, 28), dtype=np.uint8),
             val_labels=rng.integers(0, 2, (8, 1)),
             test_images=rng.integers(0, 256, (40, 28, 28), dtype=np.uint8),
             test_labels=np.tile([0, 1], 20)[:, None])
    out = tmp / "out.json"
    assert bench.main(["--sets", "cxr", "--seeds", "3", "--configs", *CONFIGS,
                       "--max-rounds", "2", "--cxr-sites", "2", "--cxr-steps", "2",
                       "--cxr-data", str(tmp / "pneumonia.npz"), "--output", str(out)]) == 0
    return json.loads(out.read_text())


def test_every_run_has_the_issue_fields(result):
    runs = {r["config"]: r for r in result["runs"]}
    assert sorted(runs) == sorted(CONFIGS)
    for run in runs.values():
        for key in ("set", "config", "up_ratio", "down_ratio", "final_metric",
                    "relative_to_dense", "bytes_to_target_ratio"):
            assert key in run
        assert run["set"] == "cxr" and run["rounds"] == 2 and len(run["curve"]) == 3
    assert runs["none"]["up_ratio"] == 1.0 and runs["none"]["down_ratio"] == 1.0
    assert runs["none"]["relative_to_dense"] == 1.0
    assert result["missing"] == [] and result["summary"] and "cxr" in result["goals"]


def test_ratios_are_the_measured_wire_bytes(result):
    runs = {r["config"]: r for r in result["runs"]}
    dense, topk = runs["none"], runs["topk:0.01+ef"]
    assert topk["up_ratio"] == pytest.approx(
        dense["up_bytes_per_site_round"] / topk["up_bytes_per_site_round"])
    assert topk["up_ratio"] > 20
    # the same dense instruction (its config names another codec: a few bytes)
    assert topk["down_ratio"] == pytest.approx(1.0, rel=1e-3)
    down = runs["topk:0.01+ef down=topk:0.01 warmup=1"]
    first, second = down["bytes_down_per_round"]
    # round 1: a dense snapshot to both sites (and its header); round 2: the steps
    assert first > dense["bytes_down_per_round"][0] and second < first / 20
    assert down["down_ratio"] > 1.5
    # warm-up: round 1 keeps 10% (0.01 ** (1/2)), round 2 the 1%
    assert down["bytes_up_per_round"][0] > 5 * down["bytes_up_per_round"][1]


def test_sites_hold_the_servers_reference_and_pay_for_what_they_get():
    rng = np.random.default_rng(1)
    names = ["a", "b"]
    x = [rng.normal(size=(30, 40)).astype(np.float32), rng.normal(size=7).astype(np.float32)]
    sender = SiteDownlink(Uplink(codec="topk:0.1", seed=2), "topk:0.1", num_sites=2,
                          local_steps=3)
    models, sizes = sender.send(1, names, x)
    snapshot = wire_size(pack_arrays(ArrayRecord({n: Array(a) for n, a in zip(names, x)})))
    assert all(s > snapshot for s in sizes)  # the packed model plus the instruction's config
    for model in models:
        assert all(np.array_equal(a, b) for a, b in zip(model, x))
    y = [a + rng.normal(scale=0.1, size=a.shape).astype(np.float32) for a in x]
    models, step_sizes = sender.send(2, names, y)
    assert max(step_sizes) < min(sizes) / 3
    reference = sender.server.reference.arrays
    for model in models:  # bit for bit what the server holds, within its residual of y
        assert all(np.array_equal(a, b) for a, b in zip(model, reference))
    assert not np.array_equal(models[0][0], y[0])


def _row(config, curve, up, down, seed=0):
    return {"set": "s", "seed": seed, "config": config, "rounds": len(curve) - 1,
            "curve": curve, "bytes_up_per_round": [up] * (len(curve) - 1),
            "bytes_down_per_round": [down] * (len(curve) - 1),
            "up_bytes_per_site_round": up / 2, "down_bytes_per_site_round": down / 2,
            "dense_fp32_bytes": 1000}


def test_bytes_to_target_counts_up_and_down_until_the_first_round_at_95_percent():
    dense = _row("none", [0.5, 0.8, 0.9, 1.0, 1.0, 1.0], 1000, 1000)
    small = _row("topk", [0.5, 0.6, 0.7, 0.8, 0.96, 0.97], 10, 20)
    never = _row("sign", [0.5, 0.6, 0.6, 0.6, 0.6, 0.6], 10, 20)
    runs = {r["config"]: r for r in compare([dense, small, never], tail=3, fraction=0.95)}
    # dense reaches 0.95 in round 3: 3 x 2000 bytes; topk in round 4: 4 x 30 bytes
    assert runs["none"]["rounds_to_target"] == 3 and runs["none"]["bytes_to_target"] == 6000
    assert runs["topk"]["rounds_to_target"] == 4
    assert runs["topk"]["bytes_to_target_ratio"] == pytest.approx(6000 / 120)
    # without round 1's downlink: (6000 - 1000) / (120 - 20)
    assert runs["topk"]["bytes_to_target_ratio_updates"] == pytest.approx(5000 / 100)
    assert runs["topk"]["up_ratio"] == 100 and runs["topk"]["down_ratio"] == 50
    assert runs["topk"]["relative_to_dense"] == pytest.approx((0.8 + 0.96 + 0.97) / 3 / 1.0)
    assert runs["sign"]["bytes_to_target_ratio"] is None
    met = goals(summarise(list(runs.values())))["s"]
    assert met["bytes_to_target"] == ["topk"] and met["ratios_and_metric"] == []
    assert met["bytes_to_target_updates"] == ["topk"]


def test_dense_stops_once_five_rounds_bring_no_half_point():
    rising = [0.0] + [0.1 * r for r in range(1, 13)]
    assert not flattened(rising)
    plateau = [0.0, 0.5, 0.7, 0.8, 0.85, 0.9, 0.9, 0.903, 0.9, 0.904, 0.902]
    assert flattened(plateau)
    assert not flattened(plateau[:8])  # fewer than 10 rounds
    assert not flattened(plateau + [0.91])  # the last five gained 0.006


def test_config_options_round_trip_and_are_checked():
    config = parse_config("topk:0.01+ef down=topk:0.01 warmup=4")
    assert (config.downlink, config.warmup_rounds, config.error_feedback) == ("topk:0.01", 4, True)
    with pytest.raises(ValueError, match="option"):
        parse_config("topk:0.01+ef speed=2")
    with pytest.raises(ValueError, match="downlink"):
        parse_config("topk:0.01+ef down=sign")
