"""``bench/personalisation.py``: the summary's arithmetic, what the output file keeps, and
``--quick`` runs through the product (in-process engine) on tiny synthetic PE hospitals and
(with ``../shared/data``) msd-lung sites: the JSON format of issue 16, equal local
computation, the same sampled sites for every method."""

from __future__ import annotations

import csv
import importlib
import json
from pathlib import Path

import pytest

bench = importlib.import_module("personalisation")
summary = importlib.import_module("personalisation_summary")

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


def _seed(seed: int, values: dict[str, float | None], examples: int = 64) -> dict:
    return {"seed": seed, "methods": {m: {"mean": {"auc": v}, "passes": 4, "examples": examples}
                                      for m, v in values.items()}}


def test_summary_is_mean_and_sd_over_seeds_with_the_paired_gain():
    per_seed = [_seed(0, {"fedavg-global": 0.70, "finetune": 0.76}),
                _seed(1, {"fedavg-global": 0.80, "finetune": 0.82})]
    rows = {r["method"]: r for r in summary.summarise("pneumoniamnist", ("auc",), per_seed)}
    assert set(rows) == {"fedavg-global", "finetune"}
    tune = rows["finetune"]
    assert tune["mean"] == pytest.approx(0.79)
    assert tune["sd"] == pytest.approx(0.0424264, abs=1e-6)  # sample sd of 0.76, 0.82
    assert tune["gain_vs_fedavg_global"] == pytest.approx(0.04)  # (0.06 + 0.02) / 2
    assert tune["gain_sd"] == pytest.approx(0.0282843, abs=1e-6)
    assert tune["seeds"] == 2 and tune["local_examples"] == [64, 64]


def test_summary_leaves_out_a_metric_defined_at_no_site():
    per_seed = [_seed(0, {"fedavg-global": None, "finetune": None})]
    assert summary.summarise("pneumoniamnist", ("auc",), per_seed) == []


def test_each_reptile_alpha_is_its_own_row_in_method_order():
    per_seed = [_seed(0, {"local-only": 0.5, "per-fedavg-reptile@0.5": 0.6,
                          "per-fedavg-reptile@0.01": 0.65, "fedavg-global": 0.7})]
    rows = summary.summarise("s", ("auc",), per_seed)
    assert [(r["method"], r.get("alpha")) for r in rows] == [
        ("fedavg-global", None), ("per-fedavg-reptile", 0.01), ("per-fedavg-reptile", 0.5),
        ("local-only", None)]
    assert rows[1]["gain_vs_fedavg_global"] == pytest.approx(-0.05)
    assert summary.variants((0.01, 0.5))[2:4] == ["per-fedavg-reptile@0.01",
                                                  "per-fedavg-reptile@0.5"]


def _payload(protocol: dict, names: list[str]) -> dict:
    return {"protocol": protocol, "sets": {n: {"name": n, "lr": 0.1} for n in names},
            "runs": [], "skipped": [], "per_seed": {}, "commands": ["new"]}


def _kept(protocol: dict) -> dict:
    kept = _payload(protocol, ["a", "b"])
    kept["runs"] = [{"set": "a", "method": "finetune"}, {"set": "b", "method": "finetune"}]
    kept["skipped"] = [{"set": "a", "method": "fedbn"}]
    kept["per_seed"] = {"a": [{"seed": 0}], "b": [{"seed": 0}]}
    kept["commands"] = ["old"]
    return kept


def test_a_run_keeps_the_sets_it_does_not_measure_and_resumes_only_equal_settings(tmp_path):
    payload = _payload({"tau": 4}, ["b"])
    summary.kept_sets(_kept({"tau": 4}), payload, ["b"], False, tmp_path)
    assert payload["sets"]["a"] == {"name": "a", "lr": 0.1}
    assert payload["runs"] == [{"set": "a", "method": "finetune"}]  # b's rows are recomputed
    assert payload["skipped"] == [{"set": "a", "method": "fedbn"}]
    assert payload["per_seed"] == {"a": [{"seed": 0}]} and payload["commands"] == ["old", "new"]
    resumed = _payload({"tau": 4}, ["b"])
    summary.kept_sets(_kept({"tau": 4}), resumed, ["b"], True, tmp_path)
    assert resumed["per_seed"]["b"] == [{"seed": 0}]
    changed = _payload({"tau": 4}, ["b"])
    changed["sets"]["b"]["lr"] = 0.2
    summary.kept_sets(_kept({"tau": 4}), changed, ["b"], True, tmp_path)
    assert "b" not in changed["per_seed"]


def test_an_output_of_another_protocol_is_refused(tmp_path):
    with pytest.raises(ValueError, match="personalisation.json holds sets measured under another"):
        summary.kept_sets(_kept({"tau": 2}), _payload({"tau": 4}, ["b"]), ["b"], False,
                          tmp_path / "personalisation.json")


def test_the_run_config_asks_the_product_for_the_protocol():
    protocol = bench.Protocol()
    config = bench.run_config(bench.SETS["pneumoniamnist"], "per-fedavg-fo", 3, protocol)
    assert config["selection.m"] == 4 and config["min-nodes"] == 20  # r = 0.2 of 20 sites
    assert config["local-steps"] == 8  # two batches a step: 16 passes, as the others
    assert bench.run_config(bench.SETS["pneumoniamnist"], "finetune", 3, protocol)[
        "local-steps"] == 16
    assert config["seed"] == 3 and config["personalisation.method"] == "per-fedavg-fo"


def test_the_heart_disease_hospitals_all_train_every_round_and_stay_four():
    hospitals = bench.SETS["heart-disease"]
    config = bench.run_config(hospitals, "finetune", 0, bench.Protocol())
    assert config["selection.m"] == 4 and config["min-nodes"] == 4  # not r = 0.2 of 4
    assert config["task"] == "tabular-cls" and config["lr"] == 0.1
    assert bench.quick_set(hospitals).sites == 4 and bench.shortened(hospitals, sites=2).sites == 4
    assert bench.sites_per_round(bench.SETS["msd-lung"], bench.Protocol()) == 2  # r = 0.2 of 10
    half = bench.SETS["heart-disease-r0.5"]  # 2 a round for twice the rounds: same passes
    assert bench.run_config(half, "finetune", 0, bench.Protocol())["selection.m"] == 2
    assert half.rounds * bench.sites_per_round(half, bench.Protocol()) == hospitals.rounds * 4


def _quick(out: Path, name: str, *extra: str) -> dict:
    assert bench.main(["--quick", "--sets", name, "--output", str(out),
                       "--shared", str(SHARED), *extra]) == 0
    return json.loads(out.read_text())


def _check_quick_rows(result: dict, name: str, work: tuple[str, ...]) -> None:
    runs = {r["method"]: r for r in result["runs"] if r["set"] == name}
    assert set(runs) == set(summary.METHODS) - {"fedbn"}  # the U-Net has no norm-layer state
    assert {"set": name, "method": "fedbn"}.items() <= result["skipped"][-1].items()
    assert runs["per-fedavg-reptile"]["alpha"] == bench.SEED_ALPHA
    for row in runs.values():
        assert row["seeds"] == 1 and row["metric"] == "dice"
        assert 0.0 <= row["mean"] <= 1.0 and row["sd"] is None  # one seed: no sd
    for key in work:
        counts = {m: tuple(r[key]) for m, r in runs.items()}
        assert len(set(counts.values())) == 1 and counts["finetune"][0] > 0, counts
    assert runs["fedavg-global"]["gain_vs_fedavg_global"] == 0.0


def test_quick_run_writes_the_issue_format_and_keeps_the_other_sets(tmp_path):
    out = tmp_path / "personalisation.json"
    other = {"set": "msd-lung", "method": "finetune", "metric": "dice", "mean": 0.5, "sd": 0.1,
             "gain_vs_fedavg_global": 0.0, "seeds": 5}
    out.write_text(json.dumps({
        "protocol": bench.protocol_record(bench.QUICK, True), "sets": {"msd-lung": {}},
        "runs": [other], "skipped": [], "per_seed": {"msd-lung": []}, "commands": ["before"]}))
    result = _quick(out, "pe-synthetic")
    _check_quick_rows(result, "pe-synthetic", ("local_passes", "local_examples"))
    assert other in result["runs"] and result["commands"][0] == "before"
    assert result["engine"] == "in-process"
    (record,) = result["per_seed"]["pe-synthetic"]
    trained = {m: r["sampled"] for m, r in record["methods"].items() if m != "local-only"}
    assert len({json.dumps(v) for v in trained.values()}) == 1  # the same site every method
    assert len(trained["finetune"][0]) == 1  # selection.m = max(1, round(0.2 x 2))
    personal = record["methods"]["finetune"]["mean"]["dice"]
    assert personal != record["methods"]["fedavg-global"]["mean"]["dice"]  # adapted


@pytest.mark.skipif(not (SHARED / bench.SETS["msd-lung"].shared_files[1]).is_file(),
                    reason="../shared/data/seg2d (msd-lung patches) absent")
def test_quick_run_on_size_skewed_msd_lung_sites(tmp_path):
    result = _quick(tmp_path / "personalisation.json", "msd-lung",
                    "--methods", "finetune", "local-only")
    runs = {r["method"]: r for r in result["runs"]}
    assert set(runs) == {"fedavg-global", "finetune", "local-only"}
    assert runs["local-only"]["local_passes"] == runs["finetune"]["local_passes"]
    sites = result["per_seed"]["msd-lung"][0]["methods"]["local-only"]["sites"]
    assert sorted(sites) == ["hospital-00", "hospital-01"]
    assert all(0.0 <= m["dice"] <= 1.0 for m in sites.values())


def _table_rows(folder: Path) -> list[tuple[str, str]]:
    with (folder / "table.csv").open(newline="") as f:
        return sorted((row["patient_id"], row["split"]) for row in csv.DictReader(f))


@pytest.mark.skipif(not (SHARED / bench.SETS["heart-disease"].shared_files[0]).is_file(),
                    reason="../shared/data/tabular (heart disease) absent")
def test_quick_run_on_the_four_heart_disease_hospitals_reads_their_test_split(tmp_path):
    result = _quick(tmp_path / "personalisation.json", "heart-disease", "--methods", "finetune")
    runs = {r["method"]: r for r in result["runs"]}
    assert set(runs) == {"fedavg-global", "finetune"}
    assert set(runs["finetune"]["metrics"]) <= {"accuracy", "auc"}
    assert runs["finetune"]["metric"] == "accuracy" and 0.0 <= runs["finetune"]["mean"] <= 1.0
    record = result["per_seed"]["heart-disease"][0]["methods"]["finetune"]
    assert record["sampled"] == [[f"hospital-0{k}" for k in range(4)]]  # all 4, every round
    bench_set = bench.quick_set(bench.SETS["heart-disease"])
    bench.build_sites(bench_set, SHARED, tmp_path / "sites", seed=3)
    split = {f.name: _table_rows(f) for f in sorted((tmp_path / "sites-split").iterdir())}
    for name, rows in split.items():  # the converter's split (seed 0), test rows measured as val
        expected = sorted((pid, "val" if s == "test" else s) for pid, s in rows if s != "val")
        assert _table_rows(tmp_path / "sites" / name) == expected
        assert any(s == "val" for _, s in expected)
    bench.build_sites(bench_set, SHARED, tmp_path / "zero" / "sites", seed=0)
    assert all(_table_rows(tmp_path / "zero" / "sites" / name) == _table_rows(
        tmp_path / "sites" / name) for name in split)  # one fixed split whatever the seed
