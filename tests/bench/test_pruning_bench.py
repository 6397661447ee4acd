"""``bench/pruning.py``: the to-target arithmetic on hand-made series, the goals, the variants'
run configs (checked by the product), and one tiny federation of each method through the
in-process engine with the issue's JSON format (issue 32, item 4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pruning as bench
import runner
from app.engine import full_run_config
from pruning_sets import PruningSettings, Variant
from pruning_summary import compare_seeds, goals, markdown_table, summarise
from strategies.wire.errors import ConfigError
from tests.bench.conftest import run_on_small_hospitals, stored_and_rebuilt

SETTINGS = PruningSettings({"unstructured": (0.15, 0.2), "structured": (0.4, 0.45)}, interval=2,
                           report_codec="topk:0.05")


def _row(variant, curve, seconds, up, down, kept=1.0, seed=0, name="s"):
    method, _, codec = variant.partition(" ")
    return {"set": name, "seed": seed, "method": method, "codec": codec or "none",
            "variant": variant, "rounds": len(curve), "curve": curve,
            "seconds_per_round": seconds, "train_seconds_per_round": [s / 2 for s in seconds],
            "bytes_up_per_round": [up] * len(curve),
            "bytes_down_per_round": [down] * len(curve),
            "up_bytes_per_site_round": up / 2, "down_bytes_per_site_round": down / 2,
            "dense_fp32_bytes": 1000, "params_kept": kept, "flops_kept": kept}


def test_target_seconds_and_bytes_count_until_the_first_round_at_95_percent_of_dense():
    dense = _row("dense", [0.5, 0.9, 1.0, 1.0], [10.0, 10.0, 10.0, 10.0], 1000, 1000)
    pruned = _row("prunefl-structured", [0.5, 0.8, 0.96, 0.99], [2.0, 3.0, 4.0, 5.0], 100, 150,
                  kept=0.12)
    never = _row("magnitude", [0.5, 0.6, 0.7, 0.7], [1.0] * 4, 10, 10, kept=0.15)
    runs = {r["variant"]: r for r in compare_seeds([dense, pruned, never], tail=2)}
    # dense: final (1 + 1) / 2 = 1, target 0.95, reached in round 3: 30 s, 3 x 2000 bytes
    assert runs["dense"]["target"] == pytest.approx(0.95)
    assert runs["dense"]["rounds_to_target"] == 3
    assert runs["dense"]["seconds_to_target"] == 30.0
    assert runs["dense"]["bytes_to_target"] == 6000
    assert runs["dense"]["seconds_ratio"] == 1.0 and runs["dense"]["bytes_ratio"] == 1.0
    # pruned: round 3 too, 2 + 3 + 4 = 9 s and 3 x 250 bytes
    p = runs["prunefl-structured"]
    assert p["seconds_to_target"] == 9.0 and p["bytes_to_target"] == 750
    assert p["seconds_ratio"] == pytest.approx(30 / 9)
    assert p["train_seconds_to_target"] == 4.5  # the sites' training: half of each round here
    assert p["train_seconds_ratio"] == pytest.approx(15 / 4.5)
    assert p["bytes_ratio"] == pytest.approx(8.0)
    assert p["up_ratio"] == 10.0 and p["down_ratio"] == pytest.approx(1000 / 150)  # per round
    assert p["final_metric"] == pytest.approx(0.975)
    assert p["relative_to_dense"] == pytest.approx(0.975)
    m = runs["magnitude"]
    assert m["rounds_to_target"] is None and m["seconds_to_target"] is None
    assert m["seconds_ratio"] is None and m["bytes_ratio"] is None


def test_a_row_without_its_dense_seed_has_no_ratios():
    dense = _row("dense", [1.0, 1.0], [1.0, 1.0], 10, 10, seed=0)
    other = _row("magnitude", [1.0, 1.0], [1.0, 1.0], 1, 1, seed=1)
    row = compare_seeds([dense, other])[1]
    assert row["relative_to_dense"] is None and row["bytes_ratio"] is None
    assert row["seconds_to_target"] is None


def test_summary_is_mean_and_sample_sd_over_seeds_with_to_target_over_the_seeds_that_reached():
    rows = []
    for seed, (late, kept) in enumerate([(0.96, 0.10), (0.80, 0.20)]):
        rows.append(_row("dense", [0.9, 1.0, 1.0], [5.0] * 3, 1000, 1000, seed=seed))
        rows.append(_row("prunefl-unstructured", [0.9, late, late], [1.0] * 3, 100, 100,
                         kept=kept, seed=seed))
    entry = summarise(compare_seeds(rows))[1]
    assert entry["method"] == "prunefl-unstructured" and entry["codec"] == "none"
    assert entry["seeds"] == [0, 1] and entry["reached"] == 1
    assert entry["params_kept"] == pytest.approx(0.15)
    assert entry["params_kept_sd"] == pytest.approx(0.0707107, abs=1e-6)  # sample sd
    assert entry["final_metric"] == pytest.approx(0.88)
    assert entry["final_metric_sd"] == pytest.approx(0.1131371, abs=1e-6)
    # only seed 0 reached 0.95 (round 2, 2 s; dense: round 2, 10 s)
    assert entry["seconds_to_target"] == 2.0 and entry["seconds_to_target_sd"] is None
    assert entry["seconds_ratio"] == pytest.approx(5.0)
    table = markdown_table(summarise(compare_seeds(rows)))
    assert "| s | prunefl-unstructured | `none` | 2 | 0.150 | 0.150 |" in table
    assert "(reached 1/2)" in table


def test_goals_are_reported_met_and_not_met_per_set():
    rows = [_row("dense", [1.0, 1.0], [10.0, 10.0], 1000, 1000, name=name)
            for name in ("a", "b")]
    rows += [  # set a: 12% kept at dense's metric, 2x sooner, 10x fewer bytes; codec 40x
        _row("prunefl-structured", [1.0, 1.0], [5.0, 5.0], 100, 100, kept=0.12, name="a"),
        _row("prunefl-structured topk:0.1+ef", [1.0, 1.0], [5.0, 5.0], 25, 25, kept=0.12,
             name="a"),
        # set b: 30% kept (too many), 1.25x sooner, 4x fewer bytes
        _row("prunefl-structured", [1.0, 1.0], [8.0, 8.0], 250, 250, kept=0.3, name="b")]
    result = goals(summarise(compare_seeds(rows)))
    a, b = result["per_set"]["a"], result["per_set"]["b"]
    assert a["small_and_accurate"] == ["prunefl-structured", "prunefl-structured topk:0.1+ef"]
    assert a["structured_speed"] == pytest.approx(2.0)
    assert a["bytes"] == ["prunefl-structured"]
    assert a["bytes_with_codec"] == ["prunefl-structured topk:0.1+ef"]
    assert b["small_and_accurate"] == [] and b["structured_speed"] == pytest.approx(1.25)
    assert b["bytes"] == [] and b["bytes_with_codec"] == []
    assert result["met"] == {"small_and_accurate": False, "structured_speed": False,
                             "bytes": False, "bytes_with_codec": False}
    only_a = goals(summarise(compare_seeds([r for r in rows if r["set"] == "a"])))
    assert all(only_a["met"].values())
    assert result["thresholds"]["params_kept_at_most"] == 0.2


def test_variants_are_run_configs_of_the_product(fake_shared):
    wanted = bench.variants(["magnitude", "prunefl-structured"], "topk:0.1+ef",
                            ["prunefl-structured"])
    assert [v.name for v in wanted] == ["dense", "magnitude", "prunefl-structured",
                                        "prunefl-structured topk:0.1+ef"]
    structured = wanted[-1].overrides(SETTINGS)
    assert structured["pruning.mode"] == "structured"
    assert structured["pruning.initial-density"] == 0.4
    assert structured["pruning.max-density"] == 0.45 and structured["pruning.interval"] == 2
    assert structured["pruning.report-codec"] == "topk:0.05"
    assert structured["strategy.codec"] == "topk:0.1"
    assert structured["strategy.error-feedback"] is True
    magnitude = Variant("magnitude").overrides(SETTINGS)
    assert magnitude["pruning.interval"] == 0 and magnitude["pruning.initial-density"] == 0.15
    assert Variant("dense").overrides(SETTINGS)["strategy.pruning"] == "none"
    assert "pruning.initial-density" not in Variant("dense").overrides(SETTINGS)
    for variant in wanted:
        full_run_config(variant.overrides(SETTINGS))
    too_dense = PruningSettings({"unstructured": (0.3, 0.2)}, interval=2)
    with pytest.raises(ConfigError, match="max-density"):
        full_run_config(Variant("magnitude").overrides(too_dense))
    args = runner.parser(bench.STUDY).parse_args(["--density", "0.3", "--max-density", "0.2",
                                                  "--shared-data", str(fake_shared)])
    with pytest.raises(ConfigError, match="max-density"):  # before any run
        runner.run_study(bench.STUDY, args, [])


def test_the_runner_builds_the_stored_run_configs(fake_shared):
    """Every run of bench/results/pruning.json: the runner, given the stored command, hands
    the engine the run config the old script did (site folders aside)."""
    stored = json.loads((Path(bench.BENCH) / "results" / "pruning.json").read_text())
    stored_configs, built = stored_and_rebuilt(bench.STUDY, stored["meta"]["commands"],
                                               stored["per_seed"], fake_shared)
    assert len(built) == 45 and built == stored_configs  # 3 sets x 3 seeds x 5 variants


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, mlflow_store):
    return run_on_small_hospitals(tmp_path_factory, mlflow_store, "pruning-bench", 5, bench.main, [
        "--sets", "synthetic-pe", "--seeds", "5", "--methods", "magnitude", "--codec-methods",
        "--rounds", "2", "--steps", "2", "--batch-size", "4"], output="pruning.json")


def test_a_tiny_federation_writes_the_issue_format(tiny):
    result = json.loads(tiny.read_text())
    assert result["meta"]["engine"] == "in-process" and result["missing"] == []
    runs = {r["method"]: r for r in result["runs"]}
    assert sorted(runs) == ["dense", "magnitude"]
    for run in runs.values():
        for key in ("set", "method", "params_kept", "final_metric", "relative_to_dense",
                    "seconds_to_target", "bytes_to_target", "seeds"):
            assert key in run
        assert (run["set"], run["seeds"]) == ("synthetic-pe", [5])
    assert runs["dense"]["params_kept"] == 1.0 and runs["dense"]["relative_to_dense"] == 1.0
    # one-shot magnitude pruning at initial density 0.15: the weights' 15% and the rest
    assert 0.15 <= runs["magnitude"]["params_kept"] < 0.16
    # the logged model's sparsity, read back from MLflow; unstructured runs dense FLOPs
    logged = {r["method"]: r["logged_model"] for r in result["per_seed"]}
    assert logged["dense"] == {}
    assert logged["magnitude"]["params-kept"] == pytest.approx(
        runs["magnitude"]["params_kept"] * logged["magnitude"]["params-total"], abs=1)
    assert runs["magnitude"]["flops_kept"] == 1.0 == runs["dense"]["flops_kept"]
    seeds = {r["method"]: r for r in result["per_seed"]}
    for seed in seeds.values():
        assert seed["rounds"] == 2 and len(seed["seconds_per_round"]) == 2
        assert all(0 < t < s for t, s in zip(seed["train_seconds_per_round"],
                                             seed["seconds_per_round"], strict=True))
        assert seed["dropped"] == [{}, {}] and seed["sites"] == 2
        assert seed["run_config"]["local-steps"] == 2 and seed["run_config"]["batch-size"] == 4
    pruned = seeds["magnitude"]
    assert pruned["run_config"]["strategy.pruning"] == "prunefl"
    assert [p["pruning-version"] for p in pruned["pruning"]] == [1.0, 1.0]  # no re-pruning
    # only the kept weights travel: each round's update is about 6x smaller than dense's
    dense_up, pruned_up = seeds["dense"]["bytes_up_per_round"], pruned["bytes_up_per_round"]
    assert all(p < d / 5 for p, d in zip(pruned_up, dense_up, strict=True))
    assert set(result["goals"]["per_set"]["synthetic-pe"]) == {
        "small_and_accurate", "structured_speed", "bytes", "bytes_with_codec"}
    assert result["goals"]["met"]["structured_speed"] is False  # not run


def test_resume_keeps_the_runs_and_the_table_reads_the_output(tiny, capsys):
    assert bench.main(["--sets", "synthetic-pe", "--seeds", "5", "--methods", "magnitude",
                       "--codec-methods", "--rounds", "2", "--steps", "2", "--batch-size", "4",
                       "--pe-data", str(tiny.parent / "pe"), "--output", str(tiny),
                       "--workdir", str(tiny.parent / "work"), "--resume"]) == 0
    result = json.loads(tiny.read_text())
    assert len(result["per_seed"]) == 2 and len(result["meta"]["commands"]) == 2
    capsys.readouterr()
    assert bench.main(["--output", str(tiny), "--table"]) == 0
    assert "| synthetic-pe | dense | `none` | 1 |" in capsys.readouterr().out
