"""3D CT classification data: volume readers, label manifest, site loader, synthetic emphysema hospitals."""

from __future__ import annotations

import csv
import logging
import shutil
from dataclasses import replace
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from clients.ct3d_cls.data import load_site
from clients.ct3d_cls.manifest import (
    MANIFEST_NAME,
    LabelError,
    read_manifest,
)
from clients.io.volume import (
    DEFAULT_SHAPE,
    LUNG_LEVEL,
    LUNG_WIDTH,
    VolumeError,
    load_ct_volume,
    read_source_volume,
    resample_volume,
)
from clients.io.dicom_series import read_dicom_series
from clients.errors import DicomSeriesError, StudyError
from clients.io.dicom_writer import write_dicom_series
from clients.ct3d_cls.synthetic import (
    SiteProfile,
    generate_site,
    site_profiles,
    main,
    synthesize_study,
)
from clients.io.nifti import write_nifti_ct
from tests.clients.manifest_cases import manifest_error

#: ../shared/data relative to the project root (see DESIGN.md, "Real data").
REAL_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
REAL_SERIES = REAL_DATA / "ctpa" / "ct_dicom_series"
REAL_NIFTI = REAL_DATA / "ctpa" / "pulmonary_ct.nii.gz"
REAL_NPY = REAL_DATA / "ct3d" / "lidc_chest_ct_uint8_zyx.npy"
REAL_SERIES_LABELS = REAL_DATA / "ctpa" / "ct_dicom_series_labels.nii.gz"
AORTA = 52  # TotalSegmentator label of the aorta in REAL_SERIES_LABELS

#: A tiny, fast hospital: 6 studies (3 positive), 32 px, 8-10 slices, DICOM and NIfTI.
TINY = SiteProfile(name="tiny-hospital", num_studies=6, noise_hu=20.0, positive_rate=0.5, dicom_fraction=0.5,
                   image_size=32, num_slices=(8, 10), slice_spacing_mm=(20.0, 24.0))
SMALL_GRID = (8, 16, 16)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _require(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"real data not found at {path} (../shared/data is optional)")
    return path


@pytest.fixture(scope="module")
def tiny_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated tiny hospital; read-only for tests (copy it before corrupting)."""
    return generate_site(tmp_path_factory.mktemp("ct3d") / "hospital", TINY, seed=11)


# --------------------------------------------------------------------------- real data


def test_real_dicom_series_to_the_fixed_grid():
    volume = load_ct_volume(_require(REAL_SERIES))
    assert volume.shape == DEFAULT_SHAPE == (32, 64, 64) and volume.dtype == np.float32
    assert 0.0 <= volume.min() and volume.max() <= 1.0
    # Air (-1024 HU) at the border maps to the bottom of the lung window, soft tissue near the top.
    air = (-1024.0 - (LUNG_LEVEL - LUNG_WIDTH / 2)) / LUNG_WIDTH
    assert volume[:, 0, 0].mean() == pytest.approx(air, abs=0.01)
    assert volume.std() > 0.1


def test_real_nifti_is_reoriented_like_its_dicom_series(real_volume):
    """The label map of the real series is stored L-A-S (rows flipped): it must land on the DICOM voxels."""
    labels = read_source_volume(_require(REAL_SERIES_LABELS))
    assert nib.aff2axcodes(nib.load(REAL_SERIES_LABELS).affine) == ("L", "A", "S")
    assert labels.shape == real_volume.shape and not labels.windowed
    assert labels.spacing == pytest.approx(real_volume.spacing, abs=1e-3)
    aorta = labels.values == AORTA
    assert aorta.sum() > 1000
    # Contrast-filled aorta is bright in the DICOM HU exactly where the NIfTI says; flipped it is not.
    assert real_volume.hu[aorta].mean() > 150.0
    assert real_volume.hu[aorta[:, ::-1, :]].mean() < real_volume.hu[aorta].mean() - 100.0


def test_real_nifti_volume_to_the_fixed_grid():
    source = read_source_volume(_require(REAL_NIFTI))
    assert source.shape == (112, 102, 122) and source.spacing == pytest.approx((1.5, 1.5, 1.5))
    volume = load_ct_volume(REAL_NIFTI, shape=(16, 48, 40))
    assert volume.shape == (16, 48, 40) and volume.dtype == np.float32
    assert 0.0 <= volume.min() and volume.max() <= 1.0 and volume.std() > 0.05


def test_real_prewindowed_npy_is_not_rewindowed():
    raw = np.load(_require(REAL_NPY), mmap_mode="r")
    source = read_source_volume(REAL_NPY)
    assert source.windowed and source.spacing is None and source.shape == raw.shape == (133, 256, 256)
    volume = load_ct_volume(REAL_NPY)
    assert volume.shape == DEFAULT_SHAPE and 0.0 <= volume.min() and volume.max() <= 1.0
    # Resampling averages: the mean intensity is the uint8 mean / 255, not a lung-windowed value.
    assert volume.mean() == pytest.approx(float(raw.mean()) / 255.0, abs=0.01)


# --------------------------------------------------------------------------- readers


def test_dicom_and_nifti_of_the_same_volume_read_identically(tmp_path):
    study = synthesize_study(TINY, np.random.default_rng(3), label=1)
    write_dicom_series(tmp_path / "dicom", study.volume, patient_id="p", uid_seed=5)
    nifti = write_nifti_ct(tmp_path / "ct.nii.gz", study.volume)
    assert nib.aff2axcodes(nib.load(nifti).affine) == ("R", "A", "S")  # stored flipped: reader must reorient
    from_dicom, from_nifti = read_source_volume(tmp_path / "dicom"), read_source_volume(nifti)
    assert np.array_equal(from_dicom.values, study.volume.hu)
    assert np.array_equal(from_nifti.values, study.volume.hu)
    assert from_nifti.spacing == pytest.approx(from_dicom.spacing, abs=1e-4)
    assert np.array_equal(load_ct_volume(tmp_path / "dicom", SMALL_GRID), load_ct_volume(nifti, SMALL_GRID))


def test_resampling_keeps_range_and_antialiases():
    const = np.full((10, 20, 30), 0.4, dtype=np.float32)
    assert np.allclose(resample_volume(const, (4, 7, 9)), 0.4, atol=1e-6)
    # A one-voxel checkerboard shrunk 8x: the box filter averages it to 0.5 (plain sampling would not).
    z, y, x = np.indices((16, 128, 128))
    checker = ((z + y + x) % 2).astype(np.float32)
    out = resample_volume(checker, (2, 16, 16))
    assert np.allclose(out, 0.5, atol=0.02)
    up = resample_volume(np.random.default_rng(0).random((3, 5, 5)).astype(np.float32), (6, 10, 10))
    assert up.shape == (6, 10, 10) and 0.0 <= up.min() and up.max() <= 1.0
    with pytest.raises(ValueError, match="shape"):
        resample_volume(const, (4, 0, 9))


@pytest.mark.parametrize(
    "name, content, reason",
    [
        ("flat.npy", np.zeros((8, 8), np.uint8), "3D"),
        ("thin.npy", np.zeros((2, 8, 8), np.uint8), "fewer than 4 voxels"),
        ("hu.npy", np.full((5, 8, 8), -800.0, np.float32), "pre-windowed"),
        ("int.npy", np.zeros((5, 8, 8), np.int16), "pre-windowed uint8"),
        ("nan.npy", np.full((5, 8, 8), np.nan, np.float32), "non-finite"),
        ("scan.txt", b"hello", "unsupported image format"),
        ("broken.nii.gz", b"\x1f\x8b not really gzip", "not a readable NIfTI"),
        ("broken.npy", b"\x93NUMPY garbage", "not a readable .npy"),
        ("missing.nii.gz", None, "does not exist"),
    ],
)
def test_bad_volumes_raise_volume_error_naming_the_file(tmp_path, name, content, reason):
    path = tmp_path / name
    if isinstance(content, np.ndarray):
        np.save(path, content)
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(VolumeError, match=reason) as info:
        load_ct_volume(path)
    assert info.value.path == path and str(path) in str(info.value)
    assert isinstance(info.value, StudyError)


def test_bad_nifti_dimensions(tmp_path):
    four_d = nib.Nifti1Image(np.zeros((6, 6, 6, 2), np.int16), np.eye(4))
    four_d.set_sform(np.eye(4), code=1)
    nib.save(four_d, tmp_path / "4d.nii.gz")
    with pytest.raises(VolumeError, match="expected a 3D volume"):
        load_ct_volume(tmp_path / "4d.nii.gz")
    no_orientation = nib.Nifti1Image(np.zeros((6, 6, 6), np.int16), None)
    no_orientation.header["qform_code"] = no_orientation.header["sform_code"] = 0
    nib.save(no_orientation, tmp_path / "plain.nii")
    with pytest.raises(VolumeError, match="no spatial orientation"):
        load_ct_volume(tmp_path / "plain.nii")


# --------------------------------------------------------------------------- synthetic hospitals


def test_synthetic_hospital_layout(tiny_site):
    entries = read_manifest(tiny_site)
    assert [e.study_id for e in entries] == [f"study-{k:03d}" for k in range(8)]  # 2 test
    assert all(e.is_valid for e in entries)
    kinds = {e.image.is_dir() for e in entries}
    assert kinds == {True, False}  # both DICOM series and NIfTI files
    assert all(e.image.name == "ct.nii.gz" for e in entries if not e.image.is_dir())
    assert (tiny_site / "SYNTHETIC.txt").is_file()
    for split in ("train", "val", "test"):
        assert {e.label for e in entries if e.split == split} == {0, 1}  # AUC defined at every split
    assert sum(e.label for e in entries) == 4


def test_synthetic_hospital_is_deterministic(tiny_site, tmp_path):
    again = generate_site(tmp_path / "again", TINY, seed=11)
    files = sorted(p.relative_to(tiny_site) for p in tiny_site.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    for rel in files:
        assert (tiny_site / rel).read_bytes() == (again / rel).read_bytes(), rel
    other = generate_site(tmp_path / "other", TINY, seed=12)
    first = read_manifest(tiny_site)[0]
    assert not np.array_equal(
        read_source_volume(first.image).values,
        read_source_volume(other / first.image.relative_to(tiny_site)).values,
    )


def test_positives_have_more_low_attenuation_lung():
    """LAA: the lung fraction below -900 HU, raw and after a 3x3x3 mean (noise-reduced, as in LAA%-950 practice)."""
    noisy = replace(TINY, noise_hu=35.0, image_size=48, num_slices=(16, 18), slice_spacing_mm=(8.0, 9.0))
    fractions: dict[int, list[tuple[float, float]]] = {0: [], 1: []}
    for k in range(8):
        study = synthesize_study(noisy, np.random.default_rng(100 + k), label=k % 2)
        hu, lung = study.volume.hu, study.lung_mask.astype(bool)
        assert lung.mean() > 0.05
        smooth = F.avg_pool3d(torch.from_numpy(hu)[None, None], 3, stride=1, padding=1)[0, 0].numpy()
        fractions[k % 2].append((float((hu[lung] < -900).mean()), float((smooth[lung] < -900).mean())))
        if k % 2:
            assert study.pattern in ("centrilobular", "panlobular") and 0.05 < study.emphysema_fraction < 0.3
            assert np.all(study.emphysema_mask <= study.lung_mask)
        else:
            assert study.pattern == "none" and study.emphysema_mask.sum() == 0
    raw = {c: [r for r, _ in fractions[c]] for c in (0, 1)}
    smooth = {c: [s for _, s in fractions[c]] for c in (0, 1)}
    assert np.mean(raw[1]) > np.mean(raw[0]) + 0.03
    assert min(smooth[1]) > max(smooth[0]) + 0.01


def test_hospitals_differ_and_profiles_are_validated(tmp_path):
    profiles = site_profiles(3, seed=0)
    assert [p.name for p in profiles] == ["hospital-00", "hospital-01", "hospital-02"]
    for field in ("num_studies", "noise_hu", "positive_rate", "dicom_fraction", "num_slices"):
        assert len({getattr(p, field) for p in profiles}) == 3, field
    assert site_profiles(3, seed=0) == profiles != site_profiles(3, seed=1)
    for bad in ({"num_studies": 3}, {"positive_rate": 1.0}, {"noise_hu": -1.0}, {"image_size": 8},
                {"num_slices": (10, 8)}, {"dicom_fraction": 1.5}):
        with pytest.raises(ValueError, match="tiny-hospital"):
            replace(TINY, **bad)
    (tmp_path / "real" / "studies").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="not a synthetic hospital"):
        generate_site(tmp_path / "real", TINY, seed=0)


def test_cli_writes_hospitals(tmp_path, capsys):
    tiny_profiles = lambda n, seed: [  # noqa: E731  (full-size hospitals are too slow for a unit test)
        replace(TINY, name=f"hospital-{i:02d}", noise_hu=10.0 + seed + i)
        for i in range(n)
    ]
    tiny_main = replace(main, generate=replace(main.generate, profiles=tiny_profiles))
    assert tiny_main(["--out", str(tmp_path / "fed"), "--sites", "2", "--seed", "4", "--image-size", "16"]) == 0
    out = capsys.readouterr().out
    assert "[1/2] hospital-00: 8 studies (4 train, 2 val, 2 test), 4 with emphysema" in out
    assert "[2/2] hospital-01" in out and "16x16 px" in out and "Done: 2 hospitals, 16 studies" in out
    for site in ("hospital-00", "hospital-01"):
        assert len(read_manifest(tmp_path / "fed" / site)) == 8
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "fed"), "--sites", "0"])


# --------------------------------------------------------------------------- manifest and loader


def test_loader_reads_every_study_of_a_clean_site(tiny_site):
    entries = read_manifest(tiny_site)
    train, report = load_site(tiny_site, "train", SMALL_GRID)
    val, val_report = load_site(tiny_site, "val", SMALL_GRID)
    assert report.skipped == {} and val_report.skipped == {}
    assert [s for s, _, _ in train] == [e.study_id for e in entries if e.split == "train"] == report.loaded
    assert len(train) + len(val) == 6
    by_id = {e.study_id: e for e in entries}
    for study_id, volume, label in train + val:
        assert volume.shape == SMALL_GRID and volume.dtype == np.float32
        assert 0.0 <= volume.min() and volume.max() <= 1.0
        assert label == by_id[study_id].label
        assert np.array_equal(volume, load_ct_volume(by_id[study_id].image, SMALL_GRID))
    with pytest.raises(ValueError, match="split"):
        load_site(tiny_site, "holdout")


def _rewrite_manifest(site: Path, edit) -> None:
    path = site / MANIFEST_NAME
    with path.open(newline="") as handle:
        rows = list(csv.reader(handle))
    rows = edit(rows)
    with path.open("w", newline="") as handle:
        csv.writer(handle, lineterminator="\n").writerows(rows)


def test_bad_items_are_skipped_counted_and_logged_once_each(tiny_site, tmp_path, caplog):
    site = shutil.copytree(tiny_site, tmp_path / "site")
    entries = read_manifest(site)
    dicom = [e for e in entries if e.image.is_dir()]
    nifti = [e for e in entries if not e.image.is_dir()]
    corrupt_slice = dicom[0].image / "zz-corrupt"
    corrupt_slice.write_bytes(b"\x00" * 200)
    nifti[0].image.write_bytes(b"\x1f\x8b\x08\x00 truncated")
    bad_label, no_label = dicom[1].study_id, nifti[1].study_id

    def edit(rows):
        for row in rows[1:]:
            if row[0] == bad_label:
                row[3] = "2"
            if row[0] == no_label:
                row[3] = ""
        rows.append(["ghost", "train", "studies/ghost/ct.nii.gz", "1"])
        rows.append(["spreadsheet", "val", nifti[-1].image.relative_to(site).as_posix(), "1.0"])
        return rows

    _rewrite_manifest(site, edit)
    with caplog.at_level(logging.WARNING, logger="clients.ct3d_cls.manifest"):
        volumes, report = load_site(site, None, SMALL_GRID)

    bad = {dicom[0].study_id, nifti[0].study_id, bad_label, no_label, "ghost"}
    assert set(report.skipped) == bad and report.num_skipped == 5
    good = [e.study_id for e in entries if e.study_id not in bad] + ["spreadsheet"]
    assert report.loaded == good == [s for s, _, _ in volumes] and report.num_loaded == 5
    assert dict((s, lbl) for s, _, lbl in volumes)["spreadsheet"] == 1
    assert str(corrupt_slice) in report.skipped[dicom[0].study_id]
    assert str(nifti[0].image) in report.skipped[nifti[0].study_id]
    assert "label '2' is not a class" in report.skipped[bad_label] and "line " in report.skipped[bad_label]
    assert "missing label" in report.skipped[no_label]
    assert "does not exist" in report.skipped["ghost"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 5 and all("\n" not in w for w in warnings)
    for study_id in bad:
        assert sum(study_id in w for w in warnings) == 1


def test_label_rows_carry_their_error(tiny_site, tmp_path):
    site = shutil.copytree(tiny_site, tmp_path / "site")
    _rewrite_manifest(site, lambda rows: rows[:2] + [["x", "val", "studies/x", "yes"]])
    entries = read_manifest(site)
    assert entries[0].is_valid and entries[0].label in (0, 1)
    assert not entries[1].is_valid and entries[1].label is None
    assert isinstance(entries[1].error, LabelError) and "line 3" in str(entries[1].error)
    assert entries[1].error.path == site.resolve() / MANIFEST_NAME


@pytest.mark.parametrize(
    "content, reason",
    [
        (None, "missing"),
        ("", "empty"),
        ("study_id,split,image,label\n", "lists no study"),
        ("\n\n", "bad header"),
        ("study_id,split,image,mask\na,train,x,1\n", "bad header"),
        ("study_id,split,image,label\na,train,x\n", "line 2: expected 4 fields"),
        ("study_id,split,image,label\na,holdout,x,1\n", "line 2: bad split"),
        ("study_id,split,image,label\n,train,x,1\n", "line 2: empty study_id"),
        ("study_id,split,image,label\na,train,,1\n", "line 2: empty image"),
        ("study_id,split,image,label\na,train,x,1\na,val,y,0\n", "line 3: duplicate study_id"),
    ],
)
def test_malformed_manifest_stops_the_site(tmp_path, content, reason):
    error = manifest_error(tmp_path, MANIFEST_NAME, content, lambda site: load_site(site, "train", SMALL_GRID))
    assert reason in str(error) and error.path == tmp_path.resolve() / MANIFEST_NAME


def test_unreadable_dicom_is_a_dicom_series_error(tiny_site, tmp_path):
    entry = next(e for e in read_manifest(tiny_site) if e.image.is_dir())
    series = shutil.copytree(entry.image, tmp_path / "series")
    next(series.iterdir()).write_bytes(b"not dicom")
    with pytest.raises(DicomSeriesError, match="not a readable DICOM file"):
        load_ct_volume(series, SMALL_GRID)
    assert read_dicom_series(entry.image).shape[0] >= TINY.num_slices[0]
