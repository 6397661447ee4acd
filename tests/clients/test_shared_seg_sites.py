"""Segmentation sites from the shared real data (clients.datagen.shared, sets ``ctpa`` and ``msd-lung``).

The real-data tests skip when ``../shared/data`` is absent; the format tests
(rescaled DICOM, NIfTI CT reorientation) run everywhere.
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pydicom
import pytest
import torch

from clients.io.dicom_series import CTVolume, list_series_files, read_dicom_series
from clients.pe_seg.manifest import read_manifest
from clients.io.nifti import read_nifti_mask
from clients.pe_seg.data import load_site
from clients.io.windowing import window_ct
from clients.io.dicom_writer import write_dicom_series

REAL_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
CTPA_FILES = ("ctpa/pulmonary_ct.nii.gz", "ctpa/pulmonary_ct_pulmonary_artery_mask.nii.gz")
MSD_FILES = ("seg2d/msd_lung_tumour_patches_val.npz", "seg2d/msd_lung_tumour_patches_test.npz")


def _require(*relpaths: str) -> Path:
    for relpath in relpaths:
        if not (REAL_DATA / relpath).is_file():
            pytest.skip(f"real data not found at {REAL_DATA / relpath} (../shared/data is optional)")
    return REAL_DATA


def _quiet(_: str) -> None:
    pass


# --- format pieces (no real data needed) --------------------------------------------------


def test_rescaled_dicom_round_trips_grid_values(tmp_path: Path) -> None:
    slope, intercept = 700.0 / 1100.0, -250.0
    levels = np.random.default_rng(0).integers(0, 1101, size=(2, 16, 16)).astype(np.float32)
    volume = CTVolume(intercept + slope * levels, (2.0, 2.0, 2.0), (0.0, 0.0, 0.0), (1, 0, 0, 0, 1, 0))
    write_dicom_series(tmp_path / "s", volume, patient_id="p", uid_seed=1, rescale_slope=slope,
                       rescale_intercept=intercept, header={"RescaleType": "US", "Manufacturer": ""})
    back = read_dicom_series(tmp_path / "s")
    np.testing.assert_allclose(window_ct(back.hu), levels / 1100.0, atol=1e-6)
    ds = pydicom.dcmread(list_series_files(tmp_path / "s")[0])
    assert ds.RescaleType == "US" and ds.Manufacturer == "" and int(ds.pixel_array.max()) <= 1100
    with pytest.raises(ValueError, match="may not override"):
        write_dicom_series(tmp_path / "t", volume, patient_id="p", uid_seed=1, header={"PixelSpacing": [1, 1]})
    with pytest.raises(ValueError, match="12 bits"):
        write_dicom_series(tmp_path / "u", volume, patient_id="p", uid_seed=1, rescale_slope=0.01)


def test_nifti_ct_volume_is_aligned_with_the_mask_reader(tmp_path: Path) -> None:
    """A RAS-ordered NIfTI CT and a mask derived from it stay voxel-aligned after both readers."""
    from clients.io.nifti import nifti_ct_volume

    rng = np.random.default_rng(1)
    data = rng.integers(-1000, 1000, size=(12, 10, 7)).astype(np.int16)  # (x, y, z), x -> R, y -> A
    affine = np.diag([1.5, 2.0, 3.0, 1.0])
    affine[:3, 3] = (-10.0, 5.0, 100.0)
    for array, name in ((data, "ct.nii.gz"), ((data > 300).astype(np.uint8), "mask.nii.gz")):
        image = nib.Nifti1Image(array, affine)
        image.set_sform(affine, code=1)
        nib.save(image, tmp_path / name)
    volume = nifti_ct_volume(tmp_path / "ct.nii.gz")
    assert volume.shape == (7, 10, 12) and volume.spacing == (3.0, 2.0, 1.5)
    mask = read_nifti_mask(tmp_path / "mask.nii.gz", reference=volume)
    np.testing.assert_array_equal(mask, (volume.hu > 300).astype(np.uint8))
    # LPS: the first column of the DICOM grid is the patient's right-most voxel (x flipped)
    np.testing.assert_array_equal(volume.hu[:, 0, 0], data[-1, -1, :])


# --- ctpa: z-blocks of one CT -------------------------------------------------------------


@pytest.fixture(scope="module")
def ctpa_sites(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    from clients.datagen.shared import convert

    shared = _require(*CTPA_FILES)
    out = tmp_path_factory.mktemp("ctpa")
    summaries = convert("pe-seg", shared, out, 3, "iid", seed=0, log=_quiet, dataset="ctpa")
    return out, summaries


def test_ctpa_blocks_load_cover_the_volume_and_keep_the_mask(ctpa_sites) -> None:
    out, summaries = ctpa_sites
    source = nib.load(REAL_DATA / CTPA_FILES[0])
    hu_source = np.asarray(source.dataobj, dtype=np.float32).transpose(2, 1, 0)  # (z, y, x); file is L, P, S
    mask_source = np.asarray(nib.load(REAL_DATA / CTPA_FILES[1]).dataobj).transpose(2, 1, 0)
    covered = np.zeros(hu_source.shape[0], dtype=int)
    mask_voxels = 0
    for summary in summaries:
        studies, report = load_site(out / summary.name)
        assert not report.skipped and len(studies) == summary.total
        assert summary.train >= 1 and summary.val >= 1
        positive_val = False
        for study in studies:
            z0, z1 = (int(v) for v in study.study_id.removeprefix("ctpa-z").split("-"))
            covered[z0:z1 + 1] += 1
            assert study.spacing == pytest.approx((1.5, 1.5, 1.5))
            np.testing.assert_array_equal(window_ct(study.hu), window_ct(hu_source[z0:z1 + 1]))
            np.testing.assert_array_equal(study.mask, mask_source[z0:z1 + 1])
            mask_voxels += int(study.mask.sum())
            positive_val |= study.split == "val" and bool(study.mask.any())
        assert positive_val, f"{summary.name}: no validation block with a mask"
        text = (out / summary.name / "SOURCE.txt").read_text()
        assert "PULMONARY ARTERY" in text and "NOT a pulmonary" in text
        assert "Apache-2.0" in text and "Wasserthal" in text and "ONE patient" in text
    assert covered.tolist() == [1] * hu_source.shape[0]  # contiguous blocks, every slice once
    assert mask_voxels == int(mask_source.sum()) > 0
    assert sum(s.positives for s in summaries) == 6 and [s.total for s in summaries] == [6, 6, 6]


def test_ctpa_refuses_foreign_folders_and_is_deterministic(ctpa_sites, tmp_path: Path) -> None:
    from clients.datagen.shared import convert

    out, _ = ctpa_sites
    foreign = tmp_path / "hospital-00"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("a hospital's own files")
    with pytest.raises(FileExistsError, match="not written by clients.datagen.shared"):
        convert("pe-seg", REAL_DATA, tmp_path, 3, "iid", seed=0, log=_quiet, dataset="ctpa")
    assert (foreign / "notes.txt").is_file()
    again = tmp_path / "again"
    convert("pe-seg", REAL_DATA, again, 3, "iid", seed=0, log=_quiet, dataset="ctpa")
    for k in range(3):
        name = f"hospital-{k:02d}/manifest.csv"
        assert (again / name).read_text() == (out / name).read_text()


# --- msd-lung: single-slice studies of pre-normalised patches -----------------------------


@pytest.fixture(scope="module")
def msd_sites(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    from clients.datagen.shared import convert

    shared = _require(*MSD_FILES)
    out = tmp_path_factory.mktemp("msd")
    summaries = convert("pe-seg", shared, out, 2, "dirichlet", alpha=0.5, seed=1, max_per_site=16,
                        log=_quiet, dataset="msd-lung")
    return out, summaries


def test_msd_patches_round_trip_through_dicom_and_window(msd_sites) -> None:
    out, summaries = msd_sites
    sources = {part: np.load(REAL_DATA / f"seg2d/msd_lung_tumour_patches_{part}.npz") for part in ("val", "test")}
    for summary in summaries:
        studies, report = load_site(out / summary.name)
        assert not report.skipped and len(studies) == summary.total == 16
        assert 0 < summary.val < 16
        for study in studies:
            part, index = study.study_id.split("-")[1], int(study.study_id.split("-")[2])
            # patient-disjoint files: train from one, val and the held-out test from the other
            assert study.split in (("val", "test") if part == "test" else ("train",))
            image = sources[part]["images"][index]
            assert study.hu.shape == study.mask.shape == (1, 48, 48)
            np.testing.assert_allclose(window_ct(study.hu), image, atol=1e-5, rtol=0)
            np.testing.assert_array_equal(study.mask, sources[part]["labels"][index])
        text = (out / summary.name / "SOURCE.txt").read_text()
        assert "NOT Hounsfield units" in text and "CC BY-SA 4.0" in text and "Antonelli" in text
        assert "lung-tumour" in text and "NOT a pulmonary embolism" in text
    entry = read_manifest(out / summaries[0].name)[0]
    ds = pydicom.dcmread(list_series_files(entry.image_dir)[0])
    assert ds.RescaleType == "US" and float(ds.RescaleIntercept) == -250.0


def test_msd_site_trains_with_slab_one(msd_sites) -> None:
    from clients.training.trainer import select_device
    from clients.pe_seg.task import PESegTask
    from clients.training.site_task import TaskSettings

    out, summaries = msd_sites
    settings = TaskSettings(image_size=48, slab_slices=1, batch_size=4)
    task = PESegTask(out / summaries[0].name, settings)
    assert task.example_input(settings).shape == (1, 1, 48, 48)
    image, target = task.train_set[0]
    assert image.shape == (1, 48, 48) and target.shape == (1, 48, 48)
    torch.manual_seed(0)
    model = task.build_model()
    before = [p.detach().clone() for p in model.parameters()]
    compute = select_device("cpu")
    result = task.train(model, 2, 1e-3, 0.9, compute, seed=0)
    assert result.steps_done == 2 and np.isfinite(result.mean_loss)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    evaluation = task.evaluate(model, compute)
    assert evaluation.num_studies == summaries[0].val and 0.0 <= evaluation.metrics["dice"] <= 1.0


def test_msd_site_without_val_patches_is_refused(tmp_path: Path) -> None:
    from clients.datagen.shared import convert

    shared = _require(*MSD_FILES)
    with pytest.raises(ValueError, match="all from one source file"):
        convert("pe-seg", shared, tmp_path, 2, "iid", seed=0, max_per_site=1, log=_quiet, dataset="msd-lung")


def test_unknown_set_for_task_is_clear(tmp_path: Path) -> None:
    from clients.datagen.shared import convert

    with pytest.raises(ValueError, match="unknown set 'msd-lung' for task 'cxr-cls'"):
        convert("cxr-cls", tmp_path, tmp_path / "out", 2, dataset="msd-lung")
