"""Tests for clients.io.dicom_series: sorting, rescale, geometry and typed errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

from clients.io.dicom_series import read_dicom_series
from clients.errors import DicomSeriesError, StudyError
from clients.pe_seg.synthetic import generate_study, synthesize_study


def _series_copy(site: Path, tmp_path: Path, study: str = "study-000") -> Path:
    """Copy one synthetic series so a test can corrupt it."""
    return Path(shutil.copytree(site / "studies" / study / "dicom", tmp_path / "series"))


def _files_by_position(folder: Path) -> list[Path]:
    """Slice files sorted by ascending z position."""
    files = [p for p in folder.iterdir() if p.is_file()]
    return sorted(files, key=lambda p: float(pydicom.dcmread(p, stop_before_pixels=True).ImagePositionPatient[2]))


def _set_z(path: Path, z: float) -> None:
    ds = pydicom.dcmread(path)
    ds.ImagePositionPatient = [ds.ImagePositionPatient[0], ds.ImagePositionPatient[1], f"{z:.4f}"]
    ds.save_as(path)


def _refusal(folder: Path, match: str | None = None) -> DicomSeriesError:
    """The :class:`DicomSeriesError` reading ``folder`` raises (its message matching ``match``)."""
    with pytest.raises(DicomSeriesError, match=match) as info:
        read_dicom_series(folder)
    return info.value


def test_real_series_reads_sorted_in_hu(real_volume) -> None:
    vol = real_volume
    assert vol.hu.shape == (20, 512, 512)
    assert vol.hu.dtype == np.float32
    assert vol.spacing[0] == pytest.approx(2.0)
    assert vol.spacing[1:] == pytest.approx((0.9765625, 0.9765625))
    # Files are named in descending-z order; the volume starts at the lowest slice.
    assert vol.origin[2] == pytest.approx(-804.5)
    assert vol.orientation == pytest.approx((1, 0, 0, 0, 1, 0))
    assert vol.hu.min() >= -1100 and vol.hu.min() < -900  # air
    assert 1000 < vol.hu.max() < 3100  # bone / contrast
    body = vol.hu[vol.hu > -500]
    assert -100 < float(np.median(body)) < 150  # soft tissue dominates the body
    assert np.array_equal(vol.affine_lps()[:3, 3], vol.origin)


def test_synthetic_round_trip_matches_generator(tmp_path, small_profile) -> None:
    expected = synthesize_study(small_profile, np.random.default_rng(11), 48)
    generate_study(tmp_path, "s1", small_profile, np.random.default_rng(11), 48)
    vol = read_dicom_series(tmp_path / "s1" / "dicom")
    assert vol.hu.shape == expected.volume.hu.shape
    assert np.abs(vol.hu - expected.volume.hu).max() <= 0.5
    assert vol.spacing == pytest.approx(expected.volume.spacing, abs=1e-4)
    assert vol.origin == pytest.approx(expected.volume.origin, abs=1e-4)


def test_file_names_do_not_drive_order(small_site, tmp_path) -> None:
    folder = _series_copy(small_site, tmp_path)
    by_z = _files_by_position(folder)
    assert sorted(by_z) != by_z, "generator should shuffle file names"
    # Rename files so that name order is the reverse of z order; the volume must not change.
    before = read_dicom_series(folder).hu
    for i, path in enumerate(reversed(by_z)):
        path.rename(folder / f"{i:03d}")
    (folder / ".DS_Store").write_bytes(b"hidden junk is skipped")
    assert np.array_equal(read_dicom_series(folder).hu, before)


def test_empty_and_missing_folder(tmp_path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / ".hidden").write_text("x")
    error = _refusal(empty)
    assert error.path == empty and "no DICOM files" in str(error)
    with pytest.raises(DicomSeriesError, match="does not exist"):
        read_dicom_series(tmp_path / "nope")


def test_unreadable_file_is_named(small_site, tmp_path) -> None:
    folder = _series_copy(small_site, tmp_path)
    bad = folder / "notes.txt"
    bad.write_text("this is not DICOM")
    error = _refusal(folder)
    assert error.path == bad
    assert str(error).startswith(f"{bad}: not a readable DICOM file")
    assert isinstance(error, StudyError)


def test_truncated_file_is_named(small_site, tmp_path) -> None:
    folder = _series_copy(small_site, tmp_path)
    victim = _files_by_position(folder)[3]
    victim.write_bytes(victim.read_bytes()[:2000])
    error = _refusal(folder)
    assert error.path == victim


def test_non_image_dicom_is_named(small_site, tmp_path) -> None:
    folder = _series_copy(small_site, tmp_path)
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.88.11"  # Basic Text SR
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = meta.MediaStorageSOPClassUID
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.Modality = "SR"
    report = folder / "report"
    ds.save_as(report, enforce_file_format=True)
    error = _refusal(folder, "no pixel data")
    assert error.path == report


def test_missing_slice(small_site, tmp_path) -> None:
    folder = _series_copy(small_site, tmp_path)
    files = _files_by_position(folder)
    files[5].unlink()
    error = _refusal(folder, "missing slice")
    assert error.path == folder
    assert files[4].name in str(error) and files[6].name in str(error)


def test_duplicate_slice(small_site, tmp_path) -> None:
    folder = _series_copy(small_site, tmp_path)
    files = _files_by_position(folder)
    shutil.copy(files[2], folder / "copy-of-slice")
    error = _refusal(folder, "duplicate slice position")
    pair = {"copy-of-slice", files[2].name}
    assert error.path.name in pair
    (other,) = pair - {error.path.name}
    assert f"same as {other}" in error.reason


def test_inconsistent_spacing(small_site, tmp_path) -> None:
    folder = _series_copy(small_site, tmp_path)
    files = _files_by_position(folder)
    z = [float(pydicom.dcmread(p, stop_before_pixels=True).ImagePositionPatient[2]) for p in files]
    step = z[1] - z[0]
    _set_z(files[4], z[4] + 0.3 * step)  # steps 1.3 and 0.7 x the median: uneven, not a gap
    error = _refusal(folder, "inconsistent slice spacing")
    assert error.path in (files[4], files[5])


def test_inconsistent_geometry_between_slices(small_site, tmp_path) -> None:
    folder = _series_copy(small_site, tmp_path)
    victim = _files_by_position(folder)[3]
    ds = pydicom.dcmread(victim)
    ds.PixelSpacing = ["1.5", "1.5"]
    ds.save_as(victim)
    error = _refusal(folder, "inconsistent PixelSpacing")
    assert error.path == victim

    ds.PixelSpacing = pydicom.dcmread(_files_by_position(folder)[0]).PixelSpacing
    ds.ImageOrientationPatient = ["1", "0", "0", "0", "0", "-1"]
    ds.save_as(victim)
    error = _refusal(folder, "inconsistent ImageOrientationPatient")
    assert error.path == victim


def test_position_off_the_normal_axis(small_site, tmp_path) -> None:
    folder = _series_copy(small_site, tmp_path)
    victim = _files_by_position(folder)[6]
    ds = pydicom.dcmread(victim)
    ds.ImagePositionPatient = [f"{float(ds.ImagePositionPatient[0]) + 20.0:.4f}", *ds.ImagePositionPatient[1:]]
    ds.save_as(victim)
    error = _refusal(folder, "off the slice-normal axis")
    assert error.path == victim


def test_other_series_is_rejected(small_site, tmp_path) -> None:
    folder = _series_copy(small_site, tmp_path)
    other = next(p for p in (small_site / "studies" / "study-001" / "dicom").iterdir())
    shutil.copy(other, folder / "stray")
    error = _refusal(folder, "another series")
    assert error.path.name == "stray"
