"""make predict (app.predict): masks on the series' grid, probabilities, skipped items, OUT rules, DATA read-only."""

from __future__ import annotations

import csv
import hashlib
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

import app.predict as predict_cli
from app.model_source import LoggedModel
from app.predict import predict
from app.prediction.inputs import discover_items
from app.prediction.output import prepare_out
from clients.io.dicom_series import read_dicom_series
from clients.io.nifti import read_nifti_mask, volume_affine_ras
from clients.pe_seg.synthetic import SiteProfile, generate_site as generate_pe_site
from clients.registry import task_class
from clients.training.trainer import select_device
from clients.training.site_task import TaskSettings
from strategies.wire.errors import ConfigError
from tests.clients.small_sites import small_cxr_site

PE_SETTINGS = TaskSettings(image_size=32, slab_slices=3)
CXR_SETTINGS = TaskSettings(image_size=32)
CPU = select_device("cpu")


def _model(task: str, settings: TaskSettings) -> LoggedModel:
    torch.manual_seed(0)
    return LoggedModel(task_class(task).model_for(settings).eval(), task, settings, False, "test")


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _tree_digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def pe_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few small synthetic CTPA studies (40 px, 6-8 slices) with their PE masks; read-only."""
    profile = SiteProfile(name="predict-hospital", num_studies=3, noise_hu=20.0, contrast_hu=200.0,
                          slice_thickness_mm=(2.0, 3.0), num_slices=(6, 8))
    return generate_pe_site(tmp_path_factory.mktemp("pe") / "site", profile, seed=3, image_size=40)


@pytest.fixture(scope="module")
def cxr_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few synthetic radiographs (PNG and DICOM, 32 px) with labels; read-only."""
    return small_cxr_site(tmp_path_factory.mktemp("cxr") / "site", 6, seed=1, num_test=4)


def test_pe_masks_have_the_series_geometry_and_data_is_untouched(pe_site: Path, tmp_path: Path) -> None:
    before = _tree_digest(pe_site)
    summary = predict(_model("pe-seg", PE_SETTINGS), pe_site, tmp_path / "out", compute=CPU)
    assert _tree_digest(pe_site) == before
    rows = _rows(tmp_path / "out" / "findings.csv")
    assert [r["id"] for r in rows] == [r["study_id"] for r in _rows(pe_site / "manifest.csv")]
    assert summary.predicted == len(rows) and not summary.skipped
    assert summary.metric == "dice" and 0.0 <= summary.value <= 1.0
    for row in rows:
        series = read_dicom_series(pe_site / row["image"])
        ours = nib.load(tmp_path / "out" / row["mask"])
        site_mask = nib.load(pe_site / "studies" / row["id"] / "pe_mask.nii.gz")
        assert ours.shape == site_mask.shape == series.shape[::-1]
        np.testing.assert_allclose(ours.affine, volume_affine_ras(series), atol=1e-4)
        np.testing.assert_allclose(ours.affine, site_mask.affine, atol=1e-4)
        mask = read_nifti_mask(tmp_path / "out" / row["mask"], reference=series)
        assert int(mask.sum()) == int(row["voxels"])
        dz, dy, dx = series.spacing
        assert float(row["volume_ml"]) == pytest.approx(int(row["voxels"]) * dz * dy * dx / 1000,
                                                        rel=1e-5)
        assert 0.0 <= float(row["max_probability"]) <= 1.0 and row["dice"] != ""


def test_a_plain_folder_of_series_is_one_item_per_series(pe_site: Path) -> None:
    pe = task_class("pe-seg")
    items = discover_items(pe, pe_site / "studies", None, PE_SETTINGS)
    series = sorted(r["image"].removeprefix("studies/") for r in _rows(pe_site / "manifest.csv"))
    assert [i.item_id for i in items] == series
    assert all(i.reference is None and i.split == "" for i in items)
    with pytest.raises(ConfigError, match="a plain folder has no splits"):
        discover_items(pe, pe_site / "studies", "test", PE_SETTINGS)
    with pytest.raises(ConfigError, match="holds manifest.csv, a pe-seg site, but the model is for cxr-cls"):
        discover_items(task_class("cxr-cls"), pe_site, None, CXR_SETTINGS)


def test_a_plain_ct_folder_holds_volume_files_and_series_folders(tmp_path: Path) -> None:
    (tmp_path / "patient-1" / "series-2").mkdir(parents=True)
    (tmp_path / "patient-1" / "series-2" / "IM0001").write_bytes(b"")
    (tmp_path / "patient-1" / "notes.txt").write_text("not an image")
    (tmp_path / "chest.nii.gz").write_bytes(b"")
    (tmp_path / "lung.npy").write_bytes(b"")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "IM0001").write_bytes(b"")
    items = discover_items(task_class("ct3d-cls"), tmp_path, None, TaskSettings())
    assert [i.item_id for i in items] == ["chest.nii.gz", "lung.npy", "patient-1/series-2"]


def test_cxr_probabilities_with_a_bad_item_skipped_and_listed(cxr_site: Path, tmp_path: Path) -> None:
    data = shutil.copytree(cxr_site, tmp_path / "data")
    bad = sorted((data / "images").iterdir())[1]
    bad.write_bytes(b"not an image")
    summary = predict(_model("cxr-cls", CXR_SETTINGS), data, tmp_path / "out", compute=CPU)
    rows = _rows(tmp_path / "out" / "predictions.csv")
    skipped = _rows(tmp_path / "out" / "skipped.csv")
    assert summary.predicted == len(rows) == len(_rows(data / "images.csv")) - 1
    assert [s["image"] for s in skipped] == [f"images/{bad.name}"] and bad.name in skipped[0]["reason"]
    assert list(summary.skipped) == [skipped[0]["id"]]
    assert all(0.0 <= float(r["probability"]) <= 1.0 and r["label"] in ("0", "1") for r in rows)
    assert "skipped 1" in summary.lines()[0]


def test_out_is_refused_when_not_empty_or_inside_data(cxr_site: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="exists and is not empty"):
        prepare_out(out, cxr_site, overwrite=False)
    (out / "predictions.csv").write_text("old")
    (out / "masks").mkdir()
    (out / "masks" / "old.nii.gz").write_bytes(b"")
    assert prepare_out(out, cxr_site, overwrite=True) == out.resolve()
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]  # only this tool's outputs go
    with pytest.raises(ConfigError, match="inside DATA"):
        prepare_out(cxr_site / "predictions", cxr_site, overwrite=True)


def test_data_inside_out_is_refused_before_anything_is_deleted(cxr_site: Path, tmp_path: Path) -> None:
    """Found (issue 28, 5): ``make predict OVERWRITE=1`` with DATA inside OUT deleted the input."""
    out = tmp_path / "out"
    for name in ("masks", "site"):
        data = shutil.copytree(cxr_site, out / name)
        before = _tree_digest(data)
        with pytest.raises(ConfigError, match=f"DATA {data}: inside OUT {out}"):
            prepare_out(out, data, overwrite=True)
        assert _tree_digest(data) == before


def test_the_command_line_prints_the_metric_and_refuses_a_second_run(
        cxr_site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import mlflow

    logged = _model("cxr-cls", CXR_SETTINGS)
    monkeypatch.setattr(predict_cli, "load_logged_model", lambda uri: logged)
    monkeypatch.setattr(mlflow, "set_tracking_uri", lambda uri: None)  # the process's store stays
    argv = ["--model", "models:/x-best/1", "--data", str(cxr_site), "--out", str(tmp_path / "out"),
            "--device", "cpu"]
    assert predict_cli.main(argv) == 0
    out, err = capsys.readouterr()
    count = len(_rows(cxr_site / "images.csv"))
    assert f"predicted {count} item(s), skipped 0" in out and "auc = " in out and "time per item" in out
    assert f"[{count}/{count}] " in err
    assert predict_cli.main(argv) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert predict_cli.main(argv + ["--overwrite", "--split", "val"]) == 0
    assert len(_rows(tmp_path / "out" / "predictions.csv")) == sum(
        r["split"] == "val" for r in _rows(cxr_site / "images.csv"))
