"""``bench/server_optimizers.py``: tuning choice, summary and goal arithmetic, the test views,
the refusal of unknown or not-yet-available methods, and ``--quick`` runs through the product
(in-process engine) on synthetic tabular hospitals and (with ``../shared/data``) the real
heart-disease hospitals: the issue's JSON format, ``--resume`` keeping the methods a later run
does not measure and adding seeds without tuning again."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

bench = importlib.import_module("server_optimizers")
sets = importlib.import_module("server_optimizer_sets")

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"
HEART = sets.SETS["heart-disease"].shared_file


def _record(method: str, seed: int, test: list[float | None]) -> dict:
    return {"set": "s", "method": method, "seed": seed, "setting": {"lr": 0.1}, "val": test,
            "test": test}


def test_the_chosen_setting_has_the_best_validation_tail_first_on_ties():
    trials = [{"setting": {"lr": 0.03}, "val": [0.9, 0.5, 0.6]},
              {"setting": {"lr": 0.1}, "val": [0.1, 0.7, None]},
              {"setting": {"lr": 0.3}, "val": [0.0, 0.5, 0.9]}]
    assert bench.val_score(trials[0]["val"], 2) == pytest.approx(0.55)
    assert bench.val_score(trials[1]["val"], 2) == pytest.approx(0.7)  # None left out
    assert bench.choose(trials, 2)["setting"] == {"lr": 0.1}  # 0.7 ties 0.7: the first
    assert bench.choose(trials, 1)["setting"] == {"lr": 0.3}  # 0.9; lr 0.1 has none
    with pytest.raises(ValueError, match="no tuning run has a validation metric"):
        bench.choose([{"setting": {}, "val": [None]}], 1)


def test_rows_are_means_over_seeds_with_rounds_to_a_share_of_pooled():
    per_seed = [_record("pooled", 0, [0.6, 0.8, 0.8]), _record("pooled", 1, [0.7, 0.8, 1.0]),
                _record("fedavg", 0, [0.5, 0.6, 0.7]), _record("fedavg", 1, [0.5, 0.9, 0.6]),
                _record("fedyogi", 0, [0.5, 0.8, 0.85]), _record("fedyogi", 1, [0.6, 0.7, 0.9])]
    rows = {r["method"]: r for r in bench.summarise("s", "accuracy", per_seed, 0.9)}
    assert list(rows) == ["fedavg", "fedyogi", "pooled"]  # METHODS order
    assert rows["pooled"]["final_metric"] == pytest.approx(0.9)
    assert rows["pooled"]["sd"] == pytest.approx(0.1414214, abs=1e-6)
    target = 0.81
    assert rows["fedavg"]["target"] == pytest.approx(target)
    assert rows["fedavg"]["rounds_to_target"] == 2 and rows["fedavg"]["seeds_at_target"] == 1
    assert rows["fedyogi"]["rounds_to_target"] == 3.0  # rounds 3 and 3
    assert rows["pooled"]["rounds_to_target"] == 3.0  # seed 0 never (0.8 < 0.81)
    assert rows["pooled"]["seeds_at_target"] == 1
    goal = bench.goals(list(rows.values()))["s"]
    assert goal["best_federated"] == "fedyogi"  # pooled is no federated method
    assert goal["gap_closed"] == pytest.approx((0.875 - 0.65) / (0.9 - 0.65))
    assert goal["goal_met"] is True


def test_no_gap_to_close_when_pooled_is_not_above_fedavg():
    per_seed = [_record("pooled", 0, [0.6]), _record("fedavg", 0, [0.7])]
    goal = bench.goals(bench.summarise("s", "auc", per_seed, 0.95))["s"]
    assert goal["gap"] == pytest.approx(-0.1) and goal["gap_closed"] is None
    assert goal["goal_met"] is None


def test_the_grid_is_lr_times_the_method_knobs():
    grid = bench.settings_grid(bench.METHODS["fedprox"], (0.03, 0.1))
    assert grid == [{"lr": 0.03, "proximal-mu": 0.1}, {"lr": 0.03, "proximal-mu": 1.0},
                    {"lr": 0.1, "proximal-mu": 0.1}, {"lr": 0.1, "proximal-mu": 1.0}]
    assert bench.settings_grid(bench.METHODS["pooled"], (0.1,)) == [{"lr": 0.1}]


def test_a_test_view_keeps_train_rows_and_measures_the_test_rows(tmp_path):
    site = tmp_path / "hospital-00"
    (site / "images").mkdir(parents=True)
    (site / "images" / "a.png").write_bytes(b"x")
    (site / "table.csv").write_text("patient_id,split,label,age\np1,train,1,50\np2,val,0,40\n"
                                    "p3,test,1,60\n")
    view = sets.test_view(site, tmp_path / "hospital-00-test")
    assert (view / "table.csv").read_text().splitlines() == [
        "patient_id,split,label,age", "p1,train,1,50", "p3,val,1,60"]
    assert (view / "images" / "a.png").stat().st_ino == (site / "images" / "a.png").stat().st_ino


def test_an_unknown_method_is_refused_by_name(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--methods", "fedavg", "fedsgd-magic"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'fedsgd-magic'" in capsys.readouterr().err


def test_a_method_whose_key_the_product_lacks_is_refused_naming_the_key(monkeypatch, capsys):
    assert bench.unavailable() == {}  # the product declares every method's keys
    monkeypatch.setitem(bench.METHODS, "fedavg", bench.Method({"strategy.no-such-plugin": "x"}))
    assert "strategy.no-such-plugin" in bench.unavailable()["fedavg"]
    with pytest.raises(SystemExit):
        bench.main(["--methods", "fedavg"])
    assert "method 'fedavg' cannot run" in capsys.readouterr().err


def _synthetic_hospitals(task: str, shared: Path, out: Path, args: list[str]) -> list[Path]:
    """Stands in for the converter: the product's synthetic tabular hospitals."""
    sites = args[args.index("--sites") + 1]
    subprocess.run([sys.executable, "-m", "clients.datagen", "synthetic", "--task", task,
                    "--out", str(out), "--sites", sites, "--seed", "0"], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL)
    folders = sorted(p for p in out.iterdir() if p.is_dir())
    for folder in folders:  # ids unique over the hospitals, as the converter writes them
        table = folder / "table.csv"
        head, *rows = table.read_text().splitlines()
        table.write_text("\n".join([head, *(f"{folder.name}-{r}" for r in rows)]) + "\n")
    return folders


def _quick(out: Path, shared: Path, *chosen: str, extra: tuple[str, ...] = ()) -> dict:
    assert bench.main(["--quick", "--output", str(out), "--shared-data", str(shared),
                       "--methods", *chosen, *extra]) == 0
    return json.loads(out.read_text())


def _check_format(result: dict, measured: set[str]) -> None:
    rows = {r["method"]: r for r in result["runs"] if r["set"] == "heart-disease"}
    assert set(rows) == measured
    for row in rows.values():
        assert {"set", "method", "final_metric", "rounds_to_target", "seeds", "sd"} <= set(row)
        assert 0.0 <= row["final_metric"] <= 1.0 and row["seeds"] == 1 and row["sd"] is None
        assert row["metric"] == "accuracy" and row["setting"]["lr"] == sets.SETS["heart-disease"].lrs[0]
    goal = result["goals"]["heart-disease"]
    assert goal["methods_measured"] == sorted(measured)
    tuned = {t["method"]: t for t in result["tuning"]}
    assert set(tuned) == measured
    assert all(len(t["trials"]) == len(bench.settings_grid(bench.METHODS[m], sets.SETS["heart-disease"].lrs[:1]))
               for m, t in tuned.items())


def test_quick_run_through_the_product_on_synthetic_hospitals(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sets, "convert_shared", _synthetic_hospitals)
    shared = tmp_path / "shared"
    (shared / HEART).parent.mkdir(parents=True)
    (shared / HEART).touch()  # the set is present; its sites are the synthetic hospitals
    out = tmp_path / "server_optimizers.json"
    result = _quick(out, shared, "pooled")
    _check_format(result, {"pooled"})
    record = next(r for r in result["per_seed"] if r["method"] == "pooled")
    assert len(record["test"]) == 2 and len(record["val"]) == 2  # 2 rounds, both measured
    later = _quick(out, shared, "local-only", extra=("--resume",))
    _check_format(later, {"pooled", "local-only"})  # the earlier method kept
    assert len(later["commands"]) == 2
    with pytest.raises(SystemExit):  # another target fraction: not mixed into the same file
        bench.main(["--quick", "--output", str(out), "--shared-data", str(shared), "--resume",
                    "--fraction", "0.5"])
    assert "holds runs measured under another protocol" in capsys.readouterr().err
    bench.main(["--table", "--output", str(out)])
    assert "heart-disease   local-only" in capsys.readouterr().out


def test_resume_adds_seeds_to_the_tuned_choice_without_tuning_again(tmp_path, monkeypatch):
    monkeypatch.setattr(sets, "convert_shared", _synthetic_hospitals)
    shared = tmp_path / "shared"
    (shared / HEART).parent.mkdir(parents=True)
    (shared / HEART).touch()
    out = tmp_path / "server_optimizers.json"
    first = _quick(out, shared, "pooled", extra=("--lrs", "0.1", "0.3"))
    assert len(first["tuning"][0]["trials"]) == 2
    ran = []
    monkeypatch.setattr(bench, "run_method", lambda *a, **k: ran.append(a[3:5]) or {
        "val": [0.5, 0.5], "test": [0.5, 0.5], "seconds": 0.0})
    extended = _quick(out, shared, "pooled", extra=("--lrs", "0.1", "0.3", "--resume",
                                                    "--seeds", "0", "1"))
    assert ran == [(first["tuning"][0]["chosen"], 1)]  # only seed 1 of the choice ran
    assert extended["tuning"] == first["tuning"]  # not tuned again
    assert [r["seed"] for r in extended["per_seed"]] == [0, 1]
    assert extended["per_seed"][0] == first["per_seed"][0]
    assert extended["runs"][0]["seeds"] == 2
    again = _quick(out, shared, "pooled", extra=("--lrs", "0.1", "0.3", "--seeds", "0"))
    assert len(ran) == 3 and len(again["commands"]) == 1  # without --resume: run afresh


@pytest.mark.skipif(not (SHARED / HEART).is_file(), reason="../shared/data heart disease absent")
def test_quick_run_on_the_four_heart_disease_hospitals(tmp_path):
    result = _quick(tmp_path / "server_optimizers.json", SHARED, "fedavg")
    _check_format(result, {"fedavg"})
    assert result["sets"]["heart-disease"]["sites"] == 4
