"""Tests for clients.pe_seg.data: loading a site and skipping bad studies."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pydicom
import pytest

from clients.io.dicom_series import read_dicom_series
from clients.errors import ManifestError
from clients.pe_seg.manifest import read_manifest
from clients.io.nifti import read_nifti_mask, write_nifti_mask
from clients.pe_seg.data import load_site


def test_loads_every_study_of_a_clean_site(small_site) -> None:
    studies, report = load_site(small_site)
    entries = read_manifest(small_site)
    assert report.loaded == [e.study_id for e in entries] and report.skipped == {}
    for study, entry in zip(studies, entries):
        volume = read_dicom_series(entry.image_dir)
        assert np.array_equal(study.hu, volume.hu)
        assert study.mask.dtype == np.uint8 and study.mask.shape == study.hu.shape
        assert np.array_equal(study.mask, read_nifti_mask(entry.mask_path, volume))
        assert study.spacing == volume.spacing and study.split == entry.split
    val, _ = load_site(small_site, split="val")
    assert [s.study_id for s in val] == [e.study_id for e in entries if e.split == "val"]
    assert len(val) >= 1


def test_skips_exactly_the_bad_studies(small_site, tmp_path, caplog) -> None:
    site = shutil.copytree(small_site, tmp_path / "site")
    broken_file = site / "studies" / "study-001" / "dicom" / "zz-corrupt"
    broken_file.write_bytes(b"\x00" * 300)
    volume = read_dicom_series(site / "studies" / "study-002" / "dicom")
    short = type(volume)(volume.hu[:-1], volume.spacing, volume.origin, volume.orientation)
    write_nifti_mask(site / "studies" / "study-002" / "pe_mask.nii.gz", np.zeros(short.shape, np.uint8), short)

    with caplog.at_level(logging.WARNING, logger="clients.pe_seg.data"):
        studies, report = load_site(site)

    assert report.loaded == ["study-000", "study-003", "study-004"]
    assert [s.study_id for s in studies] == report.loaded
    assert set(report.skipped) == {"study-001", "study-002"} and report.num_skipped == 2
    assert str(broken_file) in report.skipped["study-001"]
    assert "does not match the DICOM volume shape" in report.skipped["study-002"]
    assert str(volume.shape) in report.skipped["study-002"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert all("\n" not in r.getMessage() for r in warnings)
    assert "study-001" in warnings[0].getMessage() and "study-002" in warnings[1].getMessage()


def test_manifest_problems_stop_the_site(tmp_path) -> None:
    with pytest.raises(ManifestError):
        load_site(tmp_path)
    with pytest.raises(ValueError, match="split"):
        load_site(tmp_path, split="holdout")


def test_a_study_with_rescale_slope_zero_is_skipped_not_read_as_slope_one(small_site, tmp_path) -> None:
    site = shutil.copytree(small_site, tmp_path / "site")
    sliced = sorted((site / "studies" / "study-001" / "dicom").iterdir())[0]
    ds = pydicom.dcmread(sliced)
    ds.RescaleSlope = 0
    ds.save_as(sliced)

    studies, report = load_site(site)

    assert "study-001" not in report.loaded and report.num_skipped == 1
    assert "RescaleSlope 0" in report.skipped["study-001"]
    assert str(sliced) in report.skipped["study-001"]
    assert [s.study_id for s in studies] == report.loaded
