"""UCI Heart Disease as a product set: 4 horizontal hospitals, and Cleveland's 3 departments."""

from __future__ import annotations

import csv
import tomllib
from pathlib import Path

import numpy as np
import pytest

from clients.datagen.__main__ import main as datagen_main
from clients.datagen.shared import convert
from clients.tabular.departments import DEPARTMENTS, write_departments
from clients.tabular.heart_variables import HEART_FEATURES
from clients.tabular.table import read_table
from clients.tabular.task import TabularClsTask
from clients.training.site_task import TaskSettings
from strategies.wire.errors import ConfigError

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
pytestmark = pytest.mark.skipif(
    not (SHARED / "tabular/heart_disease/heart_disease_4sites.npz").is_file(),
    reason="../shared/data/tabular/heart_disease is absent")


def _rows(site: Path) -> list[dict[str, str]]:
    with (site / "table.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_the_four_hospitals_are_the_sites_with_the_readme_counts(tmp_path):
    summaries = convert("tabular-cls", SHARED, tmp_path, sites=4, seed=0, log=lambda _: None)
    assert [s.total for s in summaries] == [303, 294, 123, 200]
    assert [s.positives for s in summaries] == [139, 106, 115, 149]
    for s in summaries:  # 60 / 20 / 20, val stratified
        assert abs(s.val - 0.2 * s.total) <= 2 and abs(s.test - 0.2 * s.total) <= 1
    swiss = _rows(tmp_path / "hospital-02")
    assert list(swiss[0])[3:] == list(HEART_FEATURES)
    assert all(row["chol"] == "" for row in swiss)  # recorded as 0: missing
    assert all(row["patient_id"].startswith("switzerland_") for row in swiss)
    task = TabularClsTask(tmp_path / "hospital-02", TaskSettings())
    assert task.report.skipped == {} and len(task.report.loaded) == 123
    assert task.build_model()[1].in_features == 26  # the server's network
    assert "hospital-02 = switzerland" in (tmp_path / "hospital-02" / "SOURCE.txt").read_text()


def test_another_site_count_is_refused_naming_the_set(tmp_path):
    with pytest.raises(ConfigError, match=r"set 'heart-disease' has its own 4 hospitals: "
                                          r"--sites \(SITES\) must be 4, got 3"):
        convert("tabular-cls", SHARED, tmp_path, sites=3, log=lambda _: None)


def test_departments_share_patients_and_splits_and_hold_their_own_columns_and_task(tmp_path):
    folders = write_departments(SHARED, tmp_path, seed=2)
    assert [f.name for f in folders] == ["hospital-00", "hospital-01", "hospital-02"]
    tables = {d.name: read_table(f) for f, d in zip(folders, DEPARTMENTS)}
    assert tables["clinic"].features == ("age", "sex", "trestbps", "chol", "fbs")
    assert tables["stress-lab"].features == ("restecg", "thalach", "oldpeak", "slope")
    assert tables["cath-lab"].features == ("ca", "thal")
    keyed = {name: [(r.patient_id, r.split) for r in t.rows] for name, t in tables.items()}
    assert keyed["clinic"] == keyed["stress-lab"] == keyed["cath-lab"]
    assert len(keyed["clinic"]) == 303 and keyed["clinic"][0][0] == "cleveland_000"
    splits = [split for _, split in keyed["clinic"]]
    assert (splits.count("train"), splits.count("val"), splits.count("test")) == (181, 61, 61)
    positives = {name: sum(r.label == "1" for r in t.rows) for name, t in tables.items()}
    assert positives == {"clinic": 144, "stress-lab": 99, "cath-lab": 139}  # cp == 4, exang, num > 0
    for folder, department in zip(folders, DEPARTMENTS):
        site = tomllib.loads((folder / "vertical-site.toml").read_text())
        assert site == {"task": "tabular-cls", "department": department.name}
    cath = TabularClsTask(folders[2], TaskSettings())  # 4 ca and 2 thal values are missing
    assert cath.input_width == 4 and cath.report.skipped == {}
    assert write_departments(SHARED, tmp_path, seed=2) == folders  # its own folders: rewritten


def test_coverage_keeps_a_share_per_department_independently_and_splits_stay_shared(tmp_path):
    folders = write_departments(SHARED, tmp_path, seed=0, coverage=0.8)
    kept = [dict((r.patient_id, r.split) for r in read_table(f).rows) for f in folders]
    assert [len(k) for k in kept] == [242, 242, 242]
    assert len(set(kept[0]) & set(kept[1]) & set(kept[2])) < 242
    full = dict((r.patient_id, r.split) for r in read_table(
        write_departments(SHARED, tmp_path / "all", seed=0)[0]).rows)
    assert all(full[p] == s for k in kept for p, s in k.items())


def test_the_datagen_command_writes_departments_and_refuses_a_foreign_folder(tmp_path, capsys):
    assert datagen_main(["vertical", "--set", "heart-disease", "--shared", str(SHARED),
                         "--out", str(tmp_path), "--seed", "1", "--coverage", "0.9"]) == 0
    assert "Wrote 3 sites of set heart-disease" in capsys.readouterr().out
    assert len(_rows(tmp_path / "hospital-00")) == 273  # the clinic
    (tmp_path / "other" / "hospital-00").mkdir(parents=True)
    (tmp_path / "other" / "hospital-00" / "notes.txt").write_text("a hospital's file")
    assert datagen_main(["vertical", "--set", "heart-disease", "--shared", str(SHARED),
                         "--out", str(tmp_path / "other")]) == 2
    assert "was not written by clients.tabular.departments" in capsys.readouterr().err
    assert (tmp_path / "other" / "hospital-00" / "notes.txt").is_file()
    assert np.isclose(len(_rows(tmp_path / "hospital-01")) / 303, 0.9, atol=0.01)  # stress lab
