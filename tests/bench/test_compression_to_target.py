"""Quick mode of ``bench/compression_to_target.py`` through the in-process engine.

Two tiny synthetic PE hospitals (32 px), 2 local steps, the product's
ServerApp and ClientApp. Checks the JSON shape of issue 17 item 4, that the
ratios come from the round reports' wire bytes (dense is exactly 1, top-k
sends fewer bytes; the compressed downlink's first round is a dense snapshot,
then far smaller steps that every site applies without a dropped reply), that
the product's early stopping sets dense's rounds for every config, and the
bytes-to-target rules.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import compression_to_target as bench
import runner
from app.engine import full_run_config
from bytes_to_target import compare, goals, summarise
from codec_configs import parse_config
from strategies.wire.errors import ConfigError
from tests.bench.conftest import run_on_small_hospitals, stored_and_rebuilt

CONFIGS = ["none", "topk:0.01+ef", "topk:0.01+ef down=topk:0.01 warmup=1"]


@pytest.fixture(scope="module")
def result(tmp_path_factory, mlflow_store):
    # dense stops after round 2 (patience 1, no gain of 1.0), every other config runs 2 rounds
    out = run_on_small_hospitals(tmp_path_factory, mlflow_store, "to-target", 3, bench.main, [
        "--sets", "pe", "--seeds", "3", "--configs", *CONFIGS, "--max-rounds", "3",
        "--patience", "1", "--min-delta", "1.0", "--pe-steps", "2", "--pe-batch-size", "4"])
    return json.loads(out.read_text())


def test_every_run_has_the_issue_fields(result):
    runs = {r["config"]: r for r in result["runs"]}
    assert sorted(runs) == sorted(CONFIGS)
    for run in runs.values():
        for key in ("set", "config", "up_ratio", "down_ratio", "final_metric",
                    "relative_to_dense", "bytes_to_target_ratio"):
            assert key in run
        assert run["set"] == "pe" and run["engine"] == "in-process" and run["sites"] == 2
        assert run["rounds"] == 2 and len(run["curve"]) == 2
        assert run["dropped"] == [{}, {}]  # every site's reply was accepted, every round
    assert runs["none"]["up_ratio"] == 1.0 and runs["none"]["down_ratio"] == 1.0
    assert runs["none"]["relative_to_dense"] == 1.0
    assert result["engine"] == "in-process"
    assert result["missing"] == [] and result["summary"] and "pe" in result["goals"]


def test_ratios_are_the_measured_wire_bytes(result):
    runs = {r["config"]: r for r in result["runs"]}
    dense, topk = runs["none"], runs["topk:0.01+ef"]
    assert topk["up_ratio"] == pytest.approx(
        dense["up_bytes_per_site_round"] / topk["up_bytes_per_site_round"])
    assert topk["up_ratio"] > 20
    assert topk["dense_fp32_bytes"] == dense["dense_fp32_bytes"] > 800_000  # the U-Net
    # the same dense instruction (its config names another codec: a few bytes)
    assert topk["down_ratio"] == pytest.approx(1.0, rel=1e-3)
    down = runs["topk:0.01+ef down=topk:0.01 warmup=1"]
    first, second = down["bytes_down_per_round"]
    # round 1: a dense snapshot to both sites (and its header); round 2: the steps,
    # which both sites applied to the reference they held (no reply dropped)
    assert first >= dense["bytes_down_per_round"][0] and second < first / 20
    assert down["down_ratio"] > 1.5


def _row(config, curve, up, down, seed=0):
    return {"set": "s", "seed": seed, "config": config, "rounds": len(curve),
            "curve": curve, "bytes_up_per_round": [up] * len(curve),
            "bytes_down_per_round": [down] * len(curve),
            "up_bytes_per_site_round": up / 2, "down_bytes_per_site_round": down / 2,
            "dense_fp32_bytes": 1000}


def test_bytes_to_target_counts_up_and_down_until_the_first_round_at_95_percent():
    dense = _row("none", [0.8, 0.9, 1.0, 1.0, 1.0], 1000, 1000)
    small = _row("topk", [0.6, 0.7, 0.8, 0.96, 0.97], 10, 20)
    never = _row("sign", [0.6, 0.6, 0.6, 0.6, 0.6], 10, 20)
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


def test_config_options_round_trip_and_are_checked_by_the_product(fake_shared):
    config = parse_config("topk:0.01+ef down=topk:0.01 warmup=4")
    assert (config.downlink, config.warmup_rounds, config.error_feedback) == ("topk:0.01", 4, True)
    assert config.overrides() == {"strategy.codec": "topk:0.01", "strategy.error-feedback": True,
                                  "strategy.downlink-codec": "topk:0.01",
                                  "strategy.codec-warmup-rounds": 4}
    with pytest.raises(ValueError, match="option"):
        parse_config("topk:0.01+ef speed=2")
    with pytest.raises(ConfigError, match="downlink"):
        full_run_config(parse_config("topk:0.01+ef down=sign").overrides())
    args = runner.parser(bench.STUDY).parse_args(["--configs", "topk:0.01+ef down=sign",
                                                  "--shared-data", str(fake_shared)])
    with pytest.raises(ConfigError, match="downlink"):  # before any run
        runner.run_study(bench.STUDY, args, [])


def test_the_runner_builds_the_stored_run_configs(fake_shared):
    """Every run of bench/results/compression_to_target.json: the runner, given the stored
    commands, hands the engine the run config the old script did (site folders aside)."""
    stored = json.loads((Path(bench.BENCH) / "results" / "compression_to_target.json")
                        .read_text())
    stored_configs, built = stored_and_rebuilt(bench.STUDY, stored["commands"], stored["runs"],
                                               fake_shared)
    assert built == stored_configs
