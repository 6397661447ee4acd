"""NIfTI files aligned with DICOM CT series: masks, HU volumes, one reorientation.

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

from clients.errors import MaskError, PathReason, VolumeError
from clients.io.dicom_series import MAX_SLICE_PIXELS, MAX_SLICES, CTVolume

__all__ = [
    "MAX_VOXELS", "load_nifti", "to_dicom_axes", "volume_affine_ras", "read_nifti_mask", "write_nifti_mask",
    "write_nifti_ct", "nifti_ct_volume",
]

#: Most voxels a volume file (NIfTI, ``.npy``) may hold, checked from its header before it is read:
#: as many as the largest DICOM series the reader accepts (MAX_SLICES x MAX_SLICE_PIXELS).
MAX_VOXELS = MAX_SLICES * MAX_SLICE_PIXELS
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


def load_nifti(path: Path, error: type[PathReason], what: str,
               dtype: type | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Load a 3D NIfTI file: its array in stored voxel order and its (RAS) affine.

    Trailing axes of length one are dropped; scaling (``scl_slope`` /
    ``scl_inter``) is applied by nibabel when ``dtype`` is given.

    Parameters
    ----------
    path : Path
        The ``.nii`` / ``.nii.gz`` file.
    error : type
        The :class:`~clients.errors.PathReason` error to raise (``MaskError``, ``VolumeError``).
    what : str
        What the file holds, for the messages (``mask``, ``volume``).
    dtype : type, optional
        Read the scaled values as this dtype; ``None`` keeps the stored dtype.

    Raises
    ------
    PathReason
        ``error``, if the file is missing, unreadable, not NIfTI, has no
        orientation (qform and sform codes 0), is not 3D or has more than
        :data:`MAX_VOXELS` voxels (checked from the header, before the data is read).
    """
    if not path.is_file():
        raise error(path, f"{what} file does not exist")
    try:
        image = nib.load(path)
        voxels = int(np.prod(image.shape, dtype=np.float64))
    except Exception as exc:  # nibabel raises several types for corrupt or truncated input
        raise error(path, f"not a readable NIfTI file ({type(exc).__name__}: {exc})") from exc
    if voxels > MAX_VOXELS:
        raise error(path, f"{what} of shape {tuple(image.shape)} is over the limit of {MAX_VOXELS} voxels (MAX_VOXELS)")
    try:
        data = np.asanyarray(image.dataobj) if dtype is None else np.asarray(image.dataobj, dtype=dtype)
        affine = np.asarray(image.affine, dtype=np.float64)
        header = image.header
    except Exception as exc:  # nibabel raises several types for corrupt or truncated input
        raise error(path, f"not a readable NIfTI file ({type(exc).__name__}: {exc})") from exc
    if not isinstance(header, (nib.Nifti1Header, nib.Nifti2Header)):
        raise error(path, f"expected a NIfTI file, got {type(image).__name__}")
    if int(header["sform_code"]) == 0 and int(header["qform_code"]) == 0:
        raise error(path, "NIfTI header has no spatial orientation (qform and sform codes are 0)")
    while data.ndim > 3 and data.shape[-1] == 1:
        data = data[..., 0]
    if data.ndim != 3:
        raise error(path, f"expected a 3D {what}, got shape {data.shape}")
    return data, affine


def to_dicom_axes(data: np.ndarray, affine: np.ndarray,
                  target: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Reorient a NIfTI array to DICOM axes and return it ``(z, y, x)`` with its new affine.

    The one reorientation of the product (masks, HU volumes, shared NIfTI CTs):
    :mod:`nibabel.orientations` maps the array's axes, given by its own
    ``affine``, onto the axes of ``target`` (a RAS affine, e.g. a DICOM volume's
    :func:`volume_affine_ras`) or, without one, of a standard axial DICOM
    series (columns to L, rows to P, slices ascending to S).

    Returns
    -------
    zyx : np.ndarray
        The reoriented array, C-contiguous, voxel order ``(z, y, x)``.
    affine : np.ndarray
        The RAS affine of the reoriented ``(x, y, z)`` index grid.
    """
    goal = ornt.axcodes2ornt(_DICOM_AXIAL_CODES) if target is None else ornt.io_orientation(target)
    transform = ornt.ornt_transform(ornt.io_orientation(affine), goal)
    reoriented = ornt.apply_orientation(data, transform)
    new_affine = affine @ ornt.inv_ornt_aff(transform, data.shape)
    return np.ascontiguousarray(reoriented.transpose(2, 1, 0)), new_affine


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
    data, affine = load_nifti(path, MaskError, "mask")
    zyx, new_affine = to_dicom_axes(data, affine, None if reference is None else volume_affine_ras(reference))
    mask = _to_uint8(path, zyx)

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
    _save_on_grid(path, mask_zyx, np.uint8, volume)


def write_nifti_ct(path: Path, volume: CTVolume) -> Path:
    """Write an HU volume as an ``int16`` NIfTI in RAS+ (canonical) voxel order.

    The image is built on the DICOM volume's RAS affine (:func:`volume_affine_ras`)
    and then reordered with :func:`nibabel.as_closest_canonical`, so its stored
    axes run to the patient's right, anterior and superior, unlike the DICOM
    rows and columns; the reader must reorient it. sform and qform codes are "scanner".

    Parameters
    ----------
    path : Path
        Output ``.nii.gz`` (or ``.nii``); parent folders are created.
    volume : CTVolume
        Volume with integer HU values in the int16 range.

    Returns ``path``; raises ``ValueError`` if the HU values do not fit ``int16``.
    """
    path = Path(path)
    hu = np.rint(volume.hu)
    if hu.size and (hu.min() < -32768 or hu.max() > 32767):
        raise ValueError(f"{path}: HU values do not fit int16")
    _save_on_grid(path, hu, np.int16, volume, canonical=True)
    return path


def _save_on_grid(path: Path, values_zyx: np.ndarray, dtype: type, volume: CTVolume,
                  canonical: bool = False) -> None:
    """Save ``(z, y, x)`` values as NIfTI ``(x, y, z)`` on ``volume``'s RAS affine (sform = qform = scanner)."""
    affine = volume_affine_ras(volume)
    image = nib.Nifti1Image(np.ascontiguousarray(values_zyx.astype(dtype).transpose(2, 1, 0)), affine)
    image.header.set_data_dtype(dtype)
    image.set_sform(affine, code=1)
    image.set_qform(affine, code=1)
    image.header.set_xyzt_units("mm")
    if canonical:
        image = nib.as_closest_canonical(image)
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(image, path)


def nifti_ct_volume(path: Path) -> CTVolume:
    """Read a NIfTI CT image (HU) as a :class:`~clients.io.dicom_series.CTVolume` with DICOM geometry.

    The array is reoriented by :func:`to_dicom_axes` to the axes of a standard
    axial DICOM series and returned ``(z, y, x)``; the affine gives spacing,
    origin (LPS) and direction cosines. Scaling (``scl_slope`` / ``scl_inter``)
    is applied by nibabel.

    Raises
    ------
    VolumeError
        If the file is not a readable 3D NIfTI with an orientation, or its axes
        are oblique or sheared (not representable by an axial DICOM series here).
    """
    path = Path(path)
    data, affine = load_nifti(path, VolumeError, "volume", dtype=np.float32)
    hu, affine = to_dicom_axes(data, affine)
    lps = _LPS_TO_RAS @ affine
    steps = np.linalg.norm(lps[:3, :3], axis=0)
    directions = lps[:3, :3] / steps
    if not np.allclose(directions, np.eye(3), atol=1e-4):
        raise VolumeError(path, "oblique or sheared voxel axes are not supported "
                                f"({np.round(directions, 4).tolist()})")
    dx, dy, dz = (float(v) for v in steps)
    return CTVolume(hu=hu.astype(np.float32, copy=False), spacing=(dz, dy, dx),
                    origin=tuple(float(v) for v in lps[:3, 3]),  # type: ignore[arg-type]
                    orientation=(1.0, 0.0, 0.0, 0.0, 1.0, 0.0))
