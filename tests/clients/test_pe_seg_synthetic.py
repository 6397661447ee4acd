"""Tests for clients.pe_seg.synthetic (and the phantom it draws): files, determinism, non-IID sites, learnability."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian

from clients.datagen.splits import MIN_EVAL_ITEMS
from clients.io.dicom_series import read_dicom_series
from clients.pe_seg.manifest import read_manifest
from clients.io.nifti import read_nifti_mask
from clients.pe_seg.synthetic import SiteProfile, generate_site, site_profiles, main, synthesize_study


def _pixel_data(site: Path) -> dict[str, tuple[bytes, str]]:
    """Relative file path -> (PixelData, SOPInstanceUID) for every DICOM file of a site."""
    out = {}
    for path in sorted((site / "studies").rglob("*")):
        if path.is_file() and path.parent.name == "dicom":
            ds = pydicom.dcmread(path)
            out[str(path.relative_to(site))] = (ds.PixelData, ds.SOPInstanceUID)
    return out


def test_profiles_are_deterministic_and_differ_between_sites() -> None:
    profiles = site_profiles(3, seed=0)
    assert profiles == site_profiles(3, seed=0)
    assert profiles != site_profiles(3, seed=1)
    assert [p.name for p in profiles] == ["hospital-00", "hospital-01", "hospital-02"]
    for field in ("noise_hu", "contrast_hu", "num_studies", "slice_thickness_mm", "num_slices"):
        values = [getattr(p, field) for p in profiles]
        assert len(set(values)) == 3, f"sites should differ in {field}: {values}"
    for p in profiles:
        assert 6 <= p.num_studies <= 12 and 24 <= p.num_slices[0] <= p.num_slices[1] <= 48
        assert 250 <= 150 + p.contrast_hu <= 450 and 10 <= p.noise_hu <= 45
    with pytest.raises(ValueError):
        site_profiles(0, seed=0)


def test_generated_files_are_valid_ct_series(small_site, small_profile) -> None:
    entries = read_manifest(small_site)
    assert len(entries) == small_profile.num_studies + 1  # + one held-out test study
    assert sum(e.split == "val" for e in entries) == 1  # 25 % of 4, at least one
    assert [e.split for e in entries][-1] == "test"
    series_uids, counts, steps = set(), set(), set()
    for entry in entries:
        files = [p for p in entry.image_dir.iterdir()]
        datasets = [pydicom.dcmread(p) for p in files]
        datasets.sort(key=lambda d: int(d.InstanceNumber))
        first = datasets[0]
        z0, dz = float(first.ImagePositionPatient[2]), float(first.SliceThickness)
        assert small_profile.slice_thickness_mm[0] <= dz <= small_profile.slice_thickness_mm[1]
        assert small_profile.num_slices[0] <= len(datasets) <= small_profile.num_slices[1]
        for k, ds in enumerate(datasets):
            assert ds.file_meta.TransferSyntaxUID == ExplicitVRLittleEndian
            assert ds.SOPClassUID == CTImageStorage == ds.file_meta.MediaStorageSOPClassUID
            assert ds.Modality == "CT" and ds.PatientID.startswith("test-hospital-")
            assert (ds.RescaleSlope, ds.RescaleIntercept) == (1, -1024)
            assert (ds.BitsAllocated, ds.PixelRepresentation, ds.Rows, ds.Columns) == (16, 0, 48, 48)
            assert [float(v) for v in ds.ImageOrientationPatient] == [1, 0, 0, 0, 1, 0]
            assert float(ds.ImagePositionPatient[2]) == pytest.approx(z0 + k * dz, abs=1e-3)
            assert ds.SeriesInstanceUID == first.SeriesInstanceUID
            assert ds.pixel_array.dtype == np.uint16 and ds.pixel_array.shape == (48, 48)
        assert len({ds.SOPInstanceUID for ds in datasets}) == len(datasets)
        by_instance = [str(Path(d.filename).name) for d in datasets]
        assert sorted(by_instance) != by_instance, "file names must not follow slice order"
        series_uids.add(first.SeriesInstanceUID)
        counts.add(len(datasets))
        steps.add(dz)
        volume = read_dicom_series(entry.image_dir)
        mask = read_nifti_mask(entry.mask_path, reference=volume)
        assert set(np.unique(mask).tolist()) <= {0, 1}
    assert len(series_uids) == len(entries)
    assert len(counts) > 1 and len(steps) > 1, "slice count and spacing should vary across studies"


def test_pe_free_fraction(small_site) -> None:
    positives = [read_nifti_mask(e.mask_path).any() for e in read_manifest(small_site)]
    assert positives.count(False) == 1  # round(20 % of 4)


def test_same_seed_gives_identical_files_other_seed_differs(small_site, small_profile, tmp_path) -> None:
    again = generate_site(tmp_path / "again", small_profile, seed=7, image_size=48, num_test=1)
    reference = _pixel_data(small_site)
    assert _pixel_data(again) == reference
    assert (again / "manifest.csv").read_bytes() == (small_site / "manifest.csv").read_bytes()
    # Regenerating in place replaces the old synthetic hospital.
    other = generate_site(again, small_profile, seed=8, image_size=48)
    changed = _pixel_data(other)
    assert set(changed).isdisjoint(reference), "file names derive from the (seeded) UIDs"
    assert sorted(v[0] for v in changed.values()) != sorted(v[0] for v in reference.values())


def test_refuses_to_overwrite_a_non_synthetic_site(tmp_path, small_profile, capsys) -> None:
    (tmp_path / "real-site" / "studies").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="not a synthetic hospital"):
        generate_site(tmp_path / "real-site", small_profile, seed=0)
    (tmp_path / "fed" / "hospital-00" / "studies").mkdir(parents=True)
    assert main(["--out", str(tmp_path / "fed"), "--sites", "1"]) == 1
    assert "not a synthetic hospital" in capsys.readouterr().err


def test_profile_validation() -> None:
    with pytest.raises(ValueError, match="num_slices must be an increasing range"):
        SiteProfile("bad", 2, 10.0, 200.0, slice_thickness_mm=(1.0, 2.0), num_slices=(30, 20))
    with pytest.raises(ValueError, match="num_studies must be >= 1"):
        SiteProfile("bad", 0, 10.0, 200.0, slice_thickness_mm=(1.0, 2.0), num_slices=(20, 30))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_emboli_are_dark_filling_defects_inside_vessels(seed) -> None:
    # Worst case for learnability: the weakest enhancement and the strongest noise of any site.
    profile = SiteProfile(
        "worst", 1, noise_hu=45.0, contrast_hu=150.0, slice_thickness_mm=(2.5, 3.0), num_slices=(24, 30)
    )
    study = synthesize_study(profile, np.random.default_rng(seed), 96, with_pe=True)
    pe, vessel, hu = study.pe_mask > 0, study.vessel_mask > 0, study.volume.hu
    assert pe.sum() > 100, "emboli must be big enough to learn"
    assert not np.any(pe & ~vessel), "every embolus must lie inside a vessel"
    assert np.count_nonzero(pe.any(axis=(1, 2))) >= 3, "emboli span several slices"
    # Surrounding lumen: vessel voxels near the emboli, minus the one-pixel partial-volume rim
    # (in-plane erosion), minus the emboli themselves.
    lumen = vessel.copy()
    for axis in (1, 2):
        for shift in (1, -1):
            lumen &= np.roll(vessel, shift, axis=axis)
    z, y, x = np.nonzero(pe)
    box = tuple(slice(max(int(a.min()) - 3, 0), int(a.max()) + 4) for a in (z, y, x))
    around = lumen[box] & ~pe[box]
    assert around.sum() > 50
    gap = hu[box][around].mean() - hu[pe].mean()
    assert gap > 150, f"embolus only {gap:.0f} HU darker than the surrounding vessel"
    assert 0 <= hu[pe].mean() <= 150


def test_no_pe_study_has_empty_mask() -> None:
    profile = site_profiles(1, seed=0)[0]
    study = synthesize_study(profile, np.random.default_rng(3), 64, with_pe=False)
    assert study.num_emboli_voxels == 0 and study.vessel_mask.any()


def test_cli_writes_a_federation(tmp_path, capsys) -> None:
    assert main(["--out", str(tmp_path), "--sites", "2", "--seed", "3", "--image-size", "32"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("[1/2] hospital-00:") and lines[1].startswith("[2/2] hospital-01:")
    assert lines[2].startswith("Done: 2 hospitals,")
    profiles = site_profiles(2, seed=3)
    total = 0
    for profile in profiles:
        entries = read_manifest(tmp_path / profile.name)
        assert len(entries) == profile.num_studies + MIN_EVAL_ITEMS  # the demo's test studies
        for entry in entries:
            n = len(list(entry.image_dir.iterdir()))
            assert profile.num_slices[0] <= n <= profile.num_slices[1]
            total += n
    assert f"{sum(p.num_studies + MIN_EVAL_ITEMS for p in profiles)} studies, {total} slices" in lines[2]
