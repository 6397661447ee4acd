"""Malformed headers, wrong modalities and oversized items are per-study errors (issue #12).

Every case must raise the reader's :class:`~strategies.wire.errors.ItemError` subclass
naming the file, so that the site loaders skip that study and go on.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pydicom
import pytest
from PIL import Image

from clients.errors import DicomSeriesError, RadiographError, VolumeError
from clients.io import dicom_series, nifti, radiograph, volume
from clients.io.dicom_series import read_dicom_series
from clients.io.radiograph import read_radiograph
from clients.io.radiograph_writer import write_radiograph
from clients.io.volume import load_ct_volume
from clients.pe_seg.data import load_site
from strategies.wire.errors import ItemError

pytestmark = pytest.mark.filterwarnings("ignore:Invalid value for VR DS")


def _slice_files(series: Path) -> list[Path]:
    return sorted(p for p in series.iterdir() if p.is_file())


def _edit(path: Path, **values) -> Path:
    ds = pydicom.dcmread(path)
    for keyword, value in values.items():
        setattr(ds, keyword, value)
    ds.save_as(path)
    return path


@pytest.fixture
def series(small_site: Path, tmp_path: Path) -> Path:
    """A copy of one synthetic CT series, to corrupt."""
    return Path(shutil.copytree(small_site / "studies" / "study-000" / "dicom", tmp_path / "series"))


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({"ImagePositionPatient": ["0", "0"]}, "ImagePositionPatient must have 3 value(s)"),
        ({"RescaleSlope": ["1", "2"]}, "RescaleSlope must have 1 value(s)"),
        ({"RescaleIntercept": ["-1024", "0"]}, "RescaleIntercept must have 1 value(s)"),
        ({"PixelSpacing": ["0.7"]}, "PixelSpacing must have 2 value(s)"),
        ({"ImageOrientationPatient": ["1", "0", "0", "0", "1"]}, "ImageOrientationPatient must have 6 value(s)"),
        ({"RescaleSlope": "NaN"}, "RescaleSlope is not finite"),
        ({"RescaleIntercept": "inf"}, "RescaleIntercept is not finite"),
        ({"RescaleSlope": "3e38"}, "HU values are not finite"),
        ({"Modality": "MR"}, "Modality is MR; a CT series must have Modality CT"),
        ({"Modality": ""}, "Modality is missing"),
    ],
    ids=["position-2-values", "slope-2-values", "intercept-2-values", "spacing-1-value", "orientation-5-values",
         "slope-nan", "intercept-inf", "slope-overflows", "modality-mr", "modality-missing"],
)
def test_malformed_slice_header_is_a_series_error_naming_the_file(series, values, reason) -> None:
    bad = _edit(_slice_files(series)[2], **values)
    with pytest.raises(DicomSeriesError) as info:
        read_dicom_series(series)
    assert info.value.path == bad and reason in str(info.value)
    assert isinstance(info.value, ItemError)


def test_series_size_limits_are_checked_before_reading(series, monkeypatch) -> None:
    count = len(_slice_files(series))
    monkeypatch.setattr(dicom_series, "MAX_SLICES", count - 1)
    with pytest.raises(DicomSeriesError, match=f"{count} files .* limit of {count - 1} slices") as info:
        read_dicom_series(series)
    assert info.value.path == series
    monkeypatch.setattr(dicom_series, "MAX_SLICES", count)
    monkeypatch.setattr(dicom_series, "MAX_SLICE_PIXELS", 48 * 48 - 1)
    with pytest.raises(DicomSeriesError, match="48 x 48 pixels is over the limit"):
        read_dicom_series(series)


def test_a_study_with_a_malformed_header_is_skipped_and_the_site_goes_on(small_site, tmp_path, caplog) -> None:
    site = Path(shutil.copytree(small_site, tmp_path / "hospital"))
    bad = _edit(_slice_files(site / "studies" / "study-001" / "dicom")[0], ImagePositionPatient=["0", "0"])
    _edit(_slice_files(site / "studies" / "study-002" / "dicom")[0], RescaleSlope=["1", "2"])
    items, report = load_site(site)
    assert report.loaded == ["study-000", "study-003", "study-004"] and len(items) == 3  # 004: test
    assert list(report.skipped) == ["study-001", "study-002"]
    assert str(bad) in report.skipped["study-001"] and "ImagePositionPatient" in report.skipped["study-001"]
    assert "RescaleSlope must have 1 value(s)" in report.skipped["study-002"]


def test_ct_volume_with_nan_rescale_names_the_study(series) -> None:
    bad = _edit(_slice_files(series)[0], RescaleSlope="NaN")
    with pytest.raises(DicomSeriesError, match="RescaleSlope is not finite") as info:
        load_ct_volume(series)
    assert info.value.path == bad


def test_volume_files_over_the_voxel_limit_are_refused_from_the_header(tmp_path, monkeypatch) -> None:
    array = tmp_path / "big.npy"
    np.save(array, np.zeros((8, 8, 8), np.uint8))
    monkeypatch.setattr(volume, "MAX_VOXELS", 511)
    with pytest.raises(VolumeError, match=r"\(8, 8, 8\) is over the limit of 511 voxels") as info:
        load_ct_volume(array)
    assert info.value.path == array
    image = tmp_path / "big.nii.gz"
    nifti.nib.save(nifti.nib.Nifti1Image(np.zeros((8, 8, 8), np.float32), np.eye(4)), image)
    monkeypatch.setattr(nifti, "MAX_VOXELS", 511)
    with pytest.raises(VolumeError, match="over the limit of 511 voxels"):
        load_ct_volume(image)


def _radiograph(path: Path, **values) -> Path:
    write_radiograph(path, np.tile(np.linspace(0, 1, 16), (16, 1)), "dicom-mono2", image_id="r", uid_seed=5)
    return _edit(path, **values) if values else path


@pytest.mark.parametrize("modality", ["DX", "CR", "CT"])
def test_radiograph_modalities_are_read(tmp_path, modality) -> None:
    assert read_radiograph(_radiograph(tmp_path / "r.dcm", Modality=modality), 16).shape == (16, 16)


@pytest.mark.parametrize(
    ("values", "reason"),
    [
        ({"Modality": "MR"}, "Modality is MR; a radiograph has Modality DX, CR, CT"),
        ({"Modality": ""}, "Modality is missing"),
        ({"RescaleSlope": ["1", "2"]}, "invalid Modality/VOI LUT"),
        ({"RescaleSlope": "NaN"}, "not finite"),
    ],
    ids=["mr", "no-modality", "slope-2-values", "slope-nan"],
)
def test_bad_radiograph_headers_are_radiograph_errors(tmp_path, values, reason) -> None:
    path = _radiograph(tmp_path / "r.dcm", **values)
    with pytest.raises(RadiographError) as info:
        read_radiograph(path, 16)
    assert info.value.path == path and reason in str(info.value)


def test_radiographs_over_the_pixel_limit_are_refused_before_decoding(tmp_path, monkeypatch) -> None:
    dicom = _radiograph(tmp_path / "r.dcm")
    png = tmp_path / "r.png"
    Image.fromarray(np.zeros((16, 20), np.uint8)).save(png)
    monkeypatch.setattr(radiograph, "MAX_PIXELS", 16 * 16 - 1)
    with pytest.raises(RadiographError, match="16x16 is over the limit of 255 pixels"):
        read_radiograph(dicom, 16)
    with pytest.raises(RadiographError, match="20x16 is over the limit of 255 pixels"):
        read_radiograph(png, 16)
