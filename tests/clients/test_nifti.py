"""Tests for clients.io.nifti: orientation handling, round trips and typed errors."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from clients.io.dicom_series import CTVolume
from clients.errors import MaskError
from clients.io.nifti import read_nifti_mask, volume_affine_ras, write_nifti_mask


def _volume(shape=(6, 8, 10), orientation=(1.0, 0.0, 0.0, 0.0, 1.0, 0.0)) -> CTVolume:
    return CTVolume(
        hu=np.zeros(shape, dtype=np.float32),
        spacing=(2.5, 0.8, 0.7),
        origin=(-100.0, -120.0, -300.0),
        orientation=orientation,
    )


def _random_mask(shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 3, size=shape).astype(np.uint8)


def test_real_labels_land_on_the_right_tissue(real_volume, real_labels_path) -> None:
    mask = read_nifti_mask(real_labels_path, reference=real_volume)
    assert mask.shape == real_volume.shape and mask.dtype == np.uint8
    aorta = real_volume.hu[mask == 52]
    liver = real_volume.hu[mask == 5]
    assert aorta.size > 1000 and liver.size > 1000
    assert aorta.mean() > 100, "aorta must be contrast-filled"
    assert 40 < liver.mean() < 200, "liver must be soft tissue"
    # The check has teeth: ignoring the affine (no LPS/RAS row flip) misplaces both labels.
    naive = np.asarray(nib.load(real_labels_path).dataobj).transpose(2, 1, 0)
    assert real_volume.hu[naive == 52].mean() < 100
    assert not 40 < real_volume.hu[naive == 5].mean() < 200


def test_write_read_round_trip(tmp_path) -> None:
    vol = _volume()
    mask = _random_mask(vol.shape)
    path = tmp_path / "m.nii.gz"
    write_nifti_mask(path, mask, vol)
    out = read_nifti_mask(path, reference=vol)
    assert out.dtype == np.uint8 and np.array_equal(out, mask)
    image = nib.load(path)
    assert image.shape == (10, 8, 6)  # stored (x, y, z)
    assert nib.aff2axcodes(image.affine) == ("L", "P", "S")
    # Voxel (z=0, y=0, x=0) sits at the DICOM origin, converted LPS -> RAS.
    assert np.allclose(image.affine @ [0, 0, 0, 1], [100.0, 120.0, -300.0, 1])
    # Without a reference the standard axial DICOM order is assumed.
    assert np.array_equal(read_nifti_mask(path), mask)


def test_round_trip_non_axial_reference(tmp_path) -> None:
    vol = _volume(orientation=(1.0, 0.0, 0.0, 0.0, 0.0, -1.0))  # coronal
    mask = _random_mask(vol.shape, seed=1)
    write_nifti_mask(tmp_path / "c.nii.gz", mask, vol)
    assert np.array_equal(read_nifti_mask(tmp_path / "c.nii.gz", reference=vol), mask)


def test_reorients_a_mask_stored_in_another_axis_order(tmp_path) -> None:
    vol = _volume()
    mask = _random_mask(vol.shape, seed=2)
    ras = volume_affine_ras(vol)
    nz, ny, nx = vol.shape
    # Store as (z, y flipped, x) with the matching affine, as some tools do.
    data = mask[:, ::-1, :]
    affine = np.eye(4)
    affine[:3, 0] = ras[:3, 2]
    affine[:3, 1] = -ras[:3, 1]
    affine[:3, 2] = ras[:3, 0]
    affine[:3, 3] = (ras @ [0, ny - 1, 0, 1])[:3]
    nib.save(nib.Nifti1Image(np.ascontiguousarray(data), affine), tmp_path / "p.nii.gz")
    assert np.array_equal(read_nifti_mask(tmp_path / "p.nii.gz", reference=vol), mask)


def test_shape_mismatch_names_both_shapes(tmp_path) -> None:
    vol = _volume()
    path = tmp_path / "m.nii.gz"
    write_nifti_mask(path, _random_mask(vol.shape), vol)
    other = _volume(shape=(7, 8, 10))
    with pytest.raises(MaskError) as info:
        read_nifti_mask(path, reference=other)
    assert info.value.path == path
    assert "(6, 8, 10)" in str(info.value) and "(7, 8, 10)" in str(info.value)
    with pytest.raises(MaskError, match=r"expected shape \(6, 8, 11\)"):
        read_nifti_mask(path, expected_shape=(6, 8, 11))


def test_shifted_grid_is_rejected(tmp_path) -> None:
    vol = _volume()
    path = tmp_path / "m.nii.gz"
    write_nifti_mask(path, _random_mask(vol.shape), vol)
    moved = CTVolume(vol.hu, vol.spacing, (vol.origin[0], vol.origin[1], vol.origin[2] + 5.0), vol.orientation)
    with pytest.raises(MaskError, match="shifted by 5.00 mm"):
        read_nifti_mask(path, reference=moved)


def test_unreadable_and_invalid_masks(tmp_path) -> None:
    garbage = tmp_path / "bad.nii.gz"
    garbage.write_bytes(b"definitely not nifti")
    with pytest.raises(MaskError, match="not a readable NIfTI file") as info:
        read_nifti_mask(garbage)
    assert info.value.path == garbage
    with pytest.raises(MaskError, match="does not exist"):
        read_nifti_mask(tmp_path / "missing.nii.gz")
    vol = _volume()
    floats = nib.Nifti1Image(np.full((10, 8, 6), 0.5, dtype=np.float32), volume_affine_ras(vol))
    nib.save(floats, tmp_path / "f.nii.gz")
    with pytest.raises(MaskError, match="non-integer"):
        read_nifti_mask(tmp_path / "f.nii.gz", reference=vol)


def test_write_rejects_wrong_shape(tmp_path) -> None:
    with pytest.raises(ValueError, match="does not match the volume shape"):
        write_nifti_mask(tmp_path / "m.nii.gz", np.zeros((1, 2, 3), np.uint8), _volume())
    assert not Path(tmp_path / "m.nii.gz").exists()
