"""Read and write NIfTI label masks aligned with a DICOM CT series.

DICOM positions are in LPS patient coordinates (x to the patient's Left, y to
Posterior, z to Superior); NIfTI affines are in RAS (x to Right, y to
Anterior), so the two differ by ``diag(-1, -1, 1)``. A mask written by any
tool (dcm2niix, TotalSegmentator, ITK-SNAP, our generator) may also store its
voxels in another axis order or with flipped axes. The reader therefore
reorients the NIfTI array with :mod:`nibabel.orientations`, from the mask's
own affine to the orientation of the DICOM volume's affine, and returns it in
the reader's ``(z, y, x)`` voxel order so that ``mask[k, j, i]`` labels
``volume.hu[k, j, i]``.
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
from nibabel import orientations as ornt

from clients.dicom_series import CTVolume
from clients.errors import MaskError

__all__ = ["read_nifti_mask", "write_nifti_mask", "volume_affine_ras"]

_LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])
#: Axis codes (nibabel, RAS convention) of a standard axial DICOM volume
#: sorted by ascending z: columns go to L, rows to P, slices to S.
_DICOM_AXIAL_CODES = ("L", "P", "S")


def volume_affine_ras(volume: CTVolume) -> np.ndarray:
    """NIfTI-style (RAS) affine of a DICOM volume's ``(x, y, z)`` index grid.

    Parameters
    ----------
    volume : CTVolume
        The DICOM volume.

    Returns
    -------
    np.ndarray
        ``4 x 4`` matrix mapping ``(i, j, k, 1)`` = (column, row, slice) to RAS mm.
    """
    return _LPS_TO_RAS @ volume.affine_lps()


def _load(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Load a NIfTI file as a 3D array and its affine, or raise MaskError."""
    if not path.is_file():
        raise MaskError(path, "mask file does not exist")
    try:
        image = nib.load(path)
        data = np.asanyarray(image.dataobj)
        affine = np.asarray(image.affine, dtype=np.float64)
        header = image.header
    except Exception as exc:  # nibabel raises several types for corrupt input
        raise MaskError(path, f"not a readable NIfTI file ({type(exc).__name__}: {exc})") from exc
    if not isinstance(header, (nib.Nifti1Header, nib.Nifti2Header)):
        raise MaskError(path, f"expected a NIfTI file, got {type(image).__name__}")
    if int(header["sform_code"]) == 0 and int(header["qform_code"]) == 0:
        raise MaskError(path, "NIfTI header has no spatial orientation (qform and sform codes are 0)")
    while data.ndim > 3 and data.shape[-1] == 1:
        data = data[..., 0]
    if data.ndim != 3:
        raise MaskError(path, f"expected a 3D mask, got shape {data.shape}")
    return data, affine


def _to_uint8(path: Path, data: np.ndarray) -> np.ndarray:
    """Convert label values to uint8, refusing non-integer or out-of-range labels."""
    if data.dtype == np.uint8:
        return data
    values = np.asarray(data)
    if not np.all(np.isfinite(values)):
        raise MaskError(path, "mask contains non-finite values")
    if values.size and (values.min() < 0 or values.max() > 255):
        raise MaskError(path, f"mask labels must be in 0..255, got {values.min()}..{values.max()}")
    rounded = np.rint(values)
    if not np.allclose(rounded, values, atol=1e-3):
        raise MaskError(path, "mask contains non-integer label values")
    return rounded.astype(np.uint8)


def read_nifti_mask(
    path: Path,
    reference: CTVolume | None = None,
    expected_shape: tuple[int, int, int] | None = None,
) -> np.ndarray:
    """Read a NIfTI label mask in the voxel order of a DICOM volume.

    Parameters
    ----------
    path : Path
        The ``.nii`` / ``.nii.gz`` file.
    reference : CTVolume, optional
        The DICOM volume the mask labels. The mask is reoriented to this
        volume's axes, and its shape and position are checked against it.
        Without it, the mask is reoriented to a standard axial DICOM volume
        (columns to L, rows to P, slices ascending to S).
    expected_shape : tuple of int, optional
        Required ``(z, y, x)`` shape of the result.

    Returns
    -------
    np.ndarray
        ``uint8`` labels, shape ``(z, y, x)``: ``mask[k, j, i]`` labels
        ``reference.hu[k, j, i]``.

    Raises
    ------
    MaskError
        If the file is missing, unreadable or not 3D; has no orientation;
        holds labels that are not integers in 0..255; its shape differs from
        the reference or ``expected_shape`` (both shapes are in the message);
        or its voxel grid is not the reference's (off by half a voxel or more).
    """
    path = Path(path)
    data, affine = _load(path)
    if reference is not None:
        target = ornt.io_orientation(volume_affine_ras(reference))
    else:
        target = ornt.axcodes2ornt(_DICOM_AXIAL_CODES)
    transform = ornt.ornt_transform(ornt.io_orientation(affine), target)
    reoriented = ornt.apply_orientation(data, transform)
    new_affine = affine @ ornt.inv_ornt_aff(transform, data.shape)
    mask = _to_uint8(path, np.ascontiguousarray(reoriented.transpose(2, 1, 0)))

    if reference is not None:
        if mask.shape != reference.shape:
            raise MaskError(
                path, f"mask shape {mask.shape} (z, y, x) does not match the DICOM volume shape {reference.shape}"
            )
        _check_grid(path, new_affine, volume_affine_ras(reference), reference.spacing)
    if expected_shape is not None and mask.shape != tuple(expected_shape):
        raise MaskError(
            path, f"mask shape {mask.shape} (z, y, x) does not match the expected shape {tuple(expected_shape)}"
        )
    return mask


def _check_grid(path: Path, mask_affine: np.ndarray, volume_affine: np.ndarray, spacing: tuple[float, ...]) -> None:
    """Raise MaskError unless both affines describe the same voxel grid (within half a voxel)."""
    half_voxel = 0.5 * min(spacing)
    if not np.allclose(mask_affine[:3, :3], volume_affine[:3, :3], atol=0.05 * min(spacing)):
        raise MaskError(
            path,
            "mask voxel axes/spacing do not match the DICOM series "
            f"(mask {np.round(mask_affine[:3, :3], 3).tolist()} "
            f"vs DICOM {np.round(volume_affine[:3, :3], 3).tolist()})",
        )
    offset = float(np.linalg.norm(mask_affine[:3, 3] - volume_affine[:3, 3]))
    if offset >= half_voxel:
        raise MaskError(path, f"mask grid is shifted by {offset:.2f} mm from the DICOM series (>= half a voxel)")


def write_nifti_mask(path: Path, mask_zyx: np.ndarray, volume: CTVolume) -> None:
    """Write a ``(z, y, x)`` mask as NIfTI aligned with a DICOM volume.

    The NIfTI stores the array as ``(x, y, z)`` with the volume's RAS affine
    (both sform and qform, code "scanner"), so any NIfTI viewer overlays it
    on the series, and ``read_nifti_mask(path, volume)`` returns ``mask_zyx``.

    Parameters
    ----------
    path : Path
        Output ``.nii.gz`` (or ``.nii``) file; parent folders are created.
    mask_zyx : np.ndarray
        Integer labels in 0..255, same shape as ``volume.hu``.
    volume : CTVolume
        The DICOM volume the mask labels (only its geometry is used).

    Raises
    ------
    ValueError
        If the mask shape differs from the volume shape or its values do not fit uint8.
    """
    path = Path(path)
    mask_zyx = np.asarray(mask_zyx)
    if mask_zyx.shape != volume.shape:
        raise ValueError(f"{path}: mask shape {mask_zyx.shape} does not match the volume shape {volume.shape}")
    if mask_zyx.size and (mask_zyx.min() < 0 or mask_zyx.max() > 255):
        raise ValueError(f"{path}: mask labels must be in 0..255")
    affine = volume_affine_ras(volume)
    image = nib.Nifti1Image(np.ascontiguousarray(mask_zyx.astype(np.uint8).transpose(2, 1, 0)), affine)
    image.header.set_data_dtype(np.uint8)
    image.set_sform(affine, code=1)
    image.set_qform(affine, code=1)
    image.header.set_xyzt_units("mm")
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(image, path)
