"""Read a CT volume for volume-level classification, windowed to [0, 1] on a fixed grid.

Three on-disk forms are accepted, chosen by what ``path`` is:

* a **folder**: a DICOM series, read by :func:`clients.io.dicom_series.read_dicom_series`
  (slices sorted along the normal, stored values rescaled to HU);
* a ``.nii`` / ``.nii.gz`` **NIfTI file** in HU: reoriented by
  :func:`clients.io.nifti.to_dicom_axes` from its own affine to the DICOM axial axes
  (columns to the patient's left, rows to posterior, slices ascending to
  superior) and returned as ``(z, y, x)``, so a NIfTI export of a series reads
  like the series itself, whatever its stored axis order or flips;
* a ``.npy`` **array** ``(z, y, x)`` that is *already windowed*: ``uint8``
  (0..255 mapped to [0, 1]) or floating point in [0, 1]. Its intensity window
  is whatever its producer chose (e.g. the LIDC-IDRI volume in the shared data
  is an 8-bit rendering of unknown window); it is not re-windowed.

HU volumes are mapped to [0, 1] with a linear **lung window**, level -600 HU
and width 1500 HU, i.e. ``[-1350, 150]`` HU -> ``[0, 1]``
(``clients.io.windowing.window_ct``). This keeps the whole range that matters for
emphysema - air -1000 HU (0.23), emphysematous lung -950 HU (0.27), normal
lung ~ -850 HU (0.33), the -950 HU threshold of the LAA%-950 emphysema index
(Gevenois et al., Am J Respir Crit Care Med 1996) - distinct, while soft
tissue (~ 40 HU, 0.93) stays below saturation.

The windowed volume is then **resampled to a fixed grid** ``(D, H, W)`` (default
``(32, 64, 64)``) with trilinear interpolation
(``torch.nn.functional.interpolate``, ``align_corners=False``): each axis is
stretched independently so that the whole field of view fills the grid. The
physical aspect ratio is therefore **not** preserved (a 40 mm slab and a
330 mm chest both become D slices; voxel spacing differs between studies and
axes), as in MedMNIST-3D-style classification inputs; what is preserved is
anatomy-relative position, which is what a volume-level label needs. When an
axis shrinks by a factor >= 2 it is first averaged over ``floor(factor)``
voxels (box anti-aliasing filter), otherwise trilinear interpolation of, say,
512 -> 64 pixels would only sample every eighth pixel and small low-attenuation
clusters would alias away. Values stay in [0, 1] (both steps are convex
combinations).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from clients.errors import VolumeError
from clients.io.dicom_series import read_dicom_series
from clients.io.nifti import MAX_VOXELS, load_nifti, to_dicom_axes
from clients.io.windowing import window_ct

__all__ = [
    "VolumeError",
    "SourceVolume",
    "LUNG_LEVEL",
    "LUNG_WIDTH",
    "DEFAULT_SHAPE",
    "MIN_EXTENT",
    "NIFTI_SUFFIXES",
    "read_source_volume",
    "resample_volume",
    "load_ct_volume",
]

#: Lung window centre (HU).
LUNG_LEVEL = -600.0
#: Lung window width (HU): [-1350, 150] HU maps to [0, 1].
LUNG_WIDTH = 1500.0
#: Default classification grid (D, H, W).
DEFAULT_SHAPE = (32, 64, 64)
#: Smallest accepted extent of a source volume along any axis (voxels).
MIN_EXTENT = 4
NIFTI_SUFFIXES = (".nii", ".nii.gz")


@dataclass(frozen=True, eq=False)
class SourceVolume:
    """A volume as read from disk, before windowing and resampling.

    Attributes
    ----------
    values : np.ndarray
        ``float32`` ``(z, y, x)``: Hounsfield units when ``windowed`` is False,
        intensities in [0, 1] when it is True.
    windowed : bool
        True for pre-windowed ``.npy`` arrays.
    spacing : tuple of float or None
        ``(dz, dy, dx)`` in mm when the file records it (DICOM, NIfTI), else None.
    path : Path
        The file or folder read.
    """

    values: np.ndarray
    windowed: bool
    spacing: tuple[float, float, float] | None
    path: Path

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(z, y, x)`` shape."""
        z, y, x = self.values.shape
        return int(z), int(y), int(x)


def _is_nifti(path: Path) -> bool:
    return path.name.lower().endswith(NIFTI_SUFFIXES)


def _read_nifti_hu(path: Path) -> tuple[np.ndarray, tuple[float, float, float]]:
    """A NIfTI HU volume as ``(z, y, x)`` in DICOM axial orientation, and its spacing."""
    data, affine = load_nifti(path, VolumeError, "volume", dtype=np.float32)
    zyx, new_affine = to_dicom_axes(data, affine)
    dx, dy, dz = (float(v) for v in np.linalg.norm(new_affine[:3, :3], axis=0))
    return zyx.astype(np.float32, copy=False), (dz, dy, dx)


def _read_npy_windowed(path: Path) -> np.ndarray:
    """A pre-windowed ``(z, y, x)`` ``.npy`` volume as float32 in [0, 1]."""
    try:
        data = np.load(path, mmap_mode="r", allow_pickle=False)  # the header only, until sliced
    except Exception as exc:  # ValueError, OSError, EOFError, UnpicklingError...
        raise VolumeError(path, f"not a readable .npy array ({type(exc).__name__}: {exc})") from exc
    if data.size > MAX_VOXELS:
        raise VolumeError(path, f"array of shape {data.shape} is over the limit of {MAX_VOXELS} voxels (MAX_VOXELS)")
    data = np.array(data)  # read it, into an array no longer tied to the file
    if data.dtype == np.uint8:
        return data.astype(np.float32) / np.float32(255.0)
    if not np.issubdtype(data.dtype, np.floating):
        raise VolumeError(
            path, f".npy volumes must be pre-windowed uint8 or float in [0, 1], got dtype {data.dtype}"
        )
    data = data.astype(np.float32)
    if data.size and np.all(np.isfinite(data)) and (data.min() < 0.0 or data.max() > 1.0):
        raise VolumeError(
            path,
            f".npy float volumes must be pre-windowed to [0, 1], got values in [{data.min():g}, {data.max():g}]",
        )
    return data


def read_source_volume(path: Path) -> SourceVolume:
    """Read a DICOM series folder, a NIfTI HU file or a pre-windowed ``.npy`` volume.

    Parameters
    ----------
    path : Path
        A DICOM series folder, a ``.nii`` / ``.nii.gz`` file, or a ``.npy`` file.

    Returns
    -------
    SourceVolume
        ``(z, y, x)`` values, slices ascending (DICOM, NIfTI) or as stored (``.npy``).

    Raises
    ------
    DicomSeriesError
        If the DICOM series is unusable (see :func:`read_dicom_series`).
    VolumeError
        If ``path`` does not exist or has an unsupported format; the file is
        unreadable; the volume is not 3D, has fewer than :data:`MIN_EXTENT`
        voxels along an axis or more than :data:`clients.io.nifti.MAX_VOXELS`,
        or holds non-finite values; a ``.npy`` volume is not pre-windowed.
    """
    path = Path(path)
    spacing: tuple[float, float, float] | None = None
    windowed = False
    if not path.exists():
        raise VolumeError(path, "image does not exist")
    if path.is_dir():
        volume = read_dicom_series(path)
        values, spacing = volume.hu, volume.spacing
    elif _is_nifti(path):
        values, spacing = _read_nifti_hu(path)
    elif path.suffix.lower() == ".npy":
        values, windowed = _read_npy_windowed(path), True
    else:
        raise VolumeError(
            path, "unsupported image format; expected a DICOM series folder, a .nii/.nii.gz file or a .npy array"
        )
    if values.ndim != 3:
        raise VolumeError(path, f"expected a 3D (z, y, x) volume, got shape {values.shape}")
    if min(values.shape) < MIN_EXTENT:
        raise VolumeError(path, f"volume shape {values.shape} (z, y, x) has fewer than {MIN_EXTENT} voxels on an axis")
    if not np.all(np.isfinite(values)):
        raise VolumeError(path, "volume contains non-finite values (NaN or inf)")
    return SourceVolume(values.astype(np.float32, copy=False), windowed, spacing, path)


def _check_shape(shape: tuple[int, ...]) -> tuple[int, int, int]:
    shape = tuple(int(v) for v in shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"shape must be three positive ints (D, H, W), got {shape}")
    return shape  # type: ignore[return-value]


def resample_volume(values: np.ndarray, shape: tuple[int, int, int] = DEFAULT_SHAPE) -> np.ndarray:
    """Resample a ``(z, y, x)`` volume to ``shape`` (box anti-aliasing + trilinear).

    Each axis is scaled independently to fill the grid (the physical aspect
    ratio is not preserved). An axis shrinking by a factor ``s >= 2`` is first
    averaged over ``floor(s)`` voxels; then ``F.interpolate(mode="trilinear",
    align_corners=False)`` maps to the exact size.

    Parameters
    ----------
    values : np.ndarray
        3D array.
    shape : tuple of int, optional
        Target ``(D, H, W)``. Default :data:`DEFAULT_SHAPE`.

    Returns
    -------
    np.ndarray
        ``float32`` array of ``shape``; its values lie within the input's range.

    Raises
    ------
    ValueError
        If ``values`` is not 3D or ``shape`` is not three positive ints.
    """
    target = _check_shape(shape)
    if np.ndim(values) != 3:
        raise ValueError(f"expected a 3D array, got shape {np.shape(values)}")
    tensor = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))[None, None]
    kernel = tuple(max(1, int(n // t)) for n, t in zip(tensor.shape[2:], target))
    if max(kernel) > 1:
        tensor = F.avg_pool3d(tensor, kernel_size=kernel, stride=kernel)
    if tuple(tensor.shape[2:]) != target:
        tensor = F.interpolate(tensor, size=target, mode="trilinear", align_corners=False)
    return tensor[0, 0].numpy().astype(np.float32, copy=False)


def load_ct_volume(
    path: Path,
    shape: tuple[int, int, int] = DEFAULT_SHAPE,
    level: float = LUNG_LEVEL,
    width: float = LUNG_WIDTH,
) -> np.ndarray:
    """Read a CT volume and return it windowed to [0, 1] on the fixed grid ``shape``.

    Parameters
    ----------
    path : Path
        DICOM series folder, NIfTI HU file, or pre-windowed ``.npy`` volume.
    shape : tuple of int, optional
        Output ``(D, H, W)``. Default ``(32, 64, 64)``.
    level, width : float, optional
        HU window (ignored for pre-windowed ``.npy`` input). Default lung
        window, level -600 HU, width 1500 HU.

    Returns
    -------
    np.ndarray
        ``float32`` ``(D, H, W)`` in [0, 1], slices ascending along the body axis.

    Raises
    ------
    DicomSeriesError, VolumeError
        See :func:`read_source_volume`.
    ValueError
        On a bad ``shape`` or a non-positive ``width``.
    """
    target = _check_shape(shape)
    if not width > 0:
        raise ValueError(f"window width must be > 0, got {width}")
    source = read_source_volume(path)
    values = source.values if source.windowed else window_ct(source.values, level, width)
    out = resample_volume(values, target)
    return np.clip(out, 0.0, 1.0, out=out)
