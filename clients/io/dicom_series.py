"""Read one CT DICOM series (one file per slice) into a Hounsfield-unit volume.

The slices are ordered by the projection of ``ImagePositionPatient`` onto the
slice normal ``n = row_dir x col_dir`` (the cross product of the two
``ImageOrientationPatient`` direction cosines), never by file name or
``InstanceNumber``. The slice step ``dz`` is measured from those positions;
``SliceThickness`` is a reconstruction parameter and may differ from the step.
Stored values are mapped to HU with ``HU = stored * RescaleSlope +
RescaleIntercept`` (DICOM PS3.3 C.11.1.1.2, modality LUT).

A series that cannot be turned into a regular grid (duplicate or missing
slices, uneven steps, mixed geometry) raises :class:`DicomSeriesError` naming
the offending file or folder: silently resampling such a series would hide a
data problem from the site. So does a file whose header cannot be trusted:
a Modality other than CT, a header value of the wrong count or type, a
non-finite rescale, a RescaleSlope of 0 (every pixel would be the
intercept; an absent RescaleSlope is 1), or a size over :data:`MAX_SLICES` / :data:`MAX_SLICE_PIXELS`
(checked before any pixel is decoded or stacked).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pydicom
from pydicom.dataset import FileDataset
from pydicom.multival import MultiValue

from clients.errors import DicomSeriesError

__all__ = ["CTVolume", "DecodedSlice", "decode_slice", "read_dicom_series", "list_series_files",
           "MAX_SLICES", "MAX_SLICE_PIXELS"]

#: Most slice files a series folder may hold (checked before any file is read).
MAX_SLICES = 2048
#: Most pixels (Rows x Columns) a slice may have (checked before its pixels are decoded).
MAX_SLICE_PIXELS = 1024 * 1024
#: Largest step, as a multiple of the median step, that is still "one step".
MISSING_SLICE_FACTOR = 1.5
#: Positions closer than this along the normal (mm) are the same slice.
DUPLICATE_TOLERANCE_MM = 1e-3
_ORIENTATION_ATOL = 1e-4
_SPACING_ATOL_MM = 1e-4


@dataclass(frozen=True, eq=False)
class CTVolume:
    """A CT volume on a regular grid, in Hounsfield units.

    Attributes
    ----------
    hu : np.ndarray
        ``float32`` array ``(z, y, x)``: slices sorted by ascending position
        along the slice normal, rows, columns.
    spacing : tuple of float
        ``(dz, dy, dx)`` in mm; ``dz`` is the median step between slice
        positions, ``(dy, dx)`` is ``PixelSpacing`` (row spacing, column spacing).
    origin : tuple of float
        ``ImagePositionPatient`` (LPS, mm) of the first (lowest) slice: the
        centre of voxel ``(0, 0, 0)``.
    orientation : tuple of float
        ``ImageOrientationPatient``: the direction of increasing column index
        (first three values) and of increasing row index (last three), LPS.
    """

    hu: np.ndarray
    spacing: tuple[float, float, float]
    origin: tuple[float, float, float]
    orientation: tuple[float, ...]

    @property
    def shape(self) -> tuple[int, int, int]:
        """Shape ``(z, y, x)`` of the volume."""
        z, y, x = self.hu.shape
        return int(z), int(y), int(x)

    @property
    def slice_normal(self) -> np.ndarray:
        """Unit slice normal ``row_dir x col_dir`` (LPS)."""
        row_dir = np.asarray(self.orientation[:3], dtype=np.float64)
        col_dir = np.asarray(self.orientation[3:6], dtype=np.float64)
        normal = np.cross(row_dir, col_dir)
        return normal / np.linalg.norm(normal)

    def affine_lps(self) -> np.ndarray:
        """Voxel-to-patient affine in DICOM LPS coordinates.

        Returns
        -------
        np.ndarray
            ``4 x 4`` matrix mapping the index vector ``(i, j, k, 1)`` with
            ``i`` = column (x), ``j`` = row (y), ``k`` = slice (z) - i.e.
            ``hu[k, j, i]`` - to LPS millimetres. Gantry tilt is not modelled
            (the reader rejects series whose positions leave the normal axis).
        """
        dz, dy, dx = self.spacing
        affine = np.eye(4)
        affine[:3, 0] = np.asarray(self.orientation[:3], dtype=np.float64) * dx
        affine[:3, 1] = np.asarray(self.orientation[3:6], dtype=np.float64) * dy
        affine[:3, 2] = self.slice_normal * dz
        affine[:3, 3] = self.origin
        return affine


def list_series_files(folder: Path) -> list[Path]:
    """List the candidate slice files of a series folder.

    Any regular, non-hidden file counts (real series often have no ``.dcm``
    extension); sub-folders are ignored.

    Parameters
    ----------
    folder : Path
        The series folder.

    Returns
    -------
    list of Path
        The files, sorted by name (the order carries no meaning).

    Raises
    ------
    DicomSeriesError
        If ``folder`` does not exist, is not a folder or holds no file.
    """
    folder = Path(folder)
    if not folder.exists():
        raise DicomSeriesError(folder, "DICOM series folder does not exist")
    if not folder.is_dir():
        raise DicomSeriesError(folder, "expected a DICOM series folder, found a file")
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise DicomSeriesError(folder, "no DICOM files in the series folder (it is empty)")
    return files


@dataclass(frozen=True, eq=False)
class DecodedSlice:
    """One slice file: the header values the series needs and its pixels in HU
    (:func:`decode_slice`)."""

    uid: str
    orientation: np.ndarray
    position: np.ndarray
    spacing: np.ndarray
    thickness: float
    hu: np.ndarray


def _numbers(ds: FileDataset, keyword: str, count: int, path: Path) -> np.ndarray:
    """The ``count`` finite numbers of header attribute ``keyword``; a malformed value names the file."""
    value = ds[keyword].value
    values = list(value) if isinstance(value, (list, tuple, MultiValue)) else [value]
    try:
        numbers = np.asarray([float(v) for v in values], dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DicomSeriesError(path, f"{keyword} must hold numbers, got {value!r}") from exc
    if numbers.shape != (count,):
        raise DicomSeriesError(path, f"{keyword} must have {count} value(s), got {len(values)}: {value!r}")
    if not np.all(np.isfinite(numbers)):
        raise DicomSeriesError(path, f"{keyword} is not finite ({numbers.tolist()}); the HU values would not be")
    return numbers


def _optional_number(ds: FileDataset, keyword: str, default: float, path: Path) -> float:
    """Header attribute ``keyword`` as one finite number, ``default`` when absent or empty."""
    if keyword not in ds or ds[keyword].value in (None, ""):
        return default
    return float(_numbers(ds, keyword, 1, path)[0])


def _count(ds: FileDataset, keyword: str, default: int, path: Path) -> int:
    """Integer header attribute ``keyword`` (``default`` when absent or empty)."""
    value = _optional_number(ds, keyword, float(default), path)
    if value != int(value) or value < 0:
        raise DicomSeriesError(path, f"{keyword} must be a non-negative integer, got {value:g}")
    return int(value)


def _read_slice(path: Path) -> DecodedSlice:
    """Read one slice file and decode it (:func:`decode_slice`)."""
    try:
        ds = pydicom.dcmread(path)
    except Exception as exc:  # pydicom raises many types for corrupt input
        raise DicomSeriesError(path, f"not a readable DICOM file ({type(exc).__name__}: {exc})") from exc
    return decode_slice(ds, path)


def decode_slice(ds: FileDataset, path: Path) -> DecodedSlice:
    """One slice's header values and its pixels rescaled to HU, from its parsed file ``path``.

    Header values are checked before the pixels are decoded (modality, size,
    value counts); ``RescaleSlope`` / ``RescaleIntercept`` must be single finite
    numbers (DICOM PS3.3 C.11.1.1.2), the slope non-zero. For a caller that has parsed
    the file already (the PACS sync, as each instance arrives): pass the result to
    :func:`read_dicom_series` as ``decoded`` so it is not read again.
    """
    if "PixelData" not in ds:
        raise DicomSeriesError(path, "DICOM file has no pixel data (not an image)")
    modality = str(ds.get("Modality", "") or "").strip().upper()
    if modality != "CT":
        raise DicomSeriesError(path, f"Modality is {modality or 'missing'}; a CT series must have Modality CT")
    missing = [
        kw
        for kw in ("ImagePositionPatient", "ImageOrientationPatient", "PixelSpacing", "Rows", "Columns")
        if kw not in ds or ds[kw].value in (None, "")
    ]
    if missing:
        raise DicomSeriesError(path, f"missing required attribute(s) {', '.join(missing)}")
    if _count(ds, "NumberOfFrames", 1, path) > 1:
        raise DicomSeriesError(path, "multi-frame images are not supported (expected one slice per file)")
    if _count(ds, "SamplesPerPixel", 1, path) != 1:
        raise DicomSeriesError(path, "not a grayscale image (SamplesPerPixel != 1)")
    rows, columns = _count(ds, "Rows", 0, path), _count(ds, "Columns", 0, path)
    if rows * columns > MAX_SLICE_PIXELS:
        raise DicomSeriesError(path, f"slice of {rows} x {columns} pixels is over the limit of "
                                     f"{MAX_SLICE_PIXELS} pixels per slice (MAX_SLICE_PIXELS)")
    orientation = _numbers(ds, "ImageOrientationPatient", 6, path)
    position = _numbers(ds, "ImagePositionPatient", 3, path)
    spacing = _numbers(ds, "PixelSpacing", 2, path)
    slope = _optional_number(ds, "RescaleSlope", 1.0, path)
    if slope == 0.0:
        raise DicomSeriesError(path, "RescaleSlope 0 maps every pixel to the intercept "
                                     "(no image): the study is skipped")
    intercept = _optional_number(ds, "RescaleIntercept", 0.0, path)
    thickness = _optional_number(ds, "SliceThickness", 1.0, path) or 1.0
    try:
        pixels = ds.pixel_array
    except Exception as exc:
        raise DicomSeriesError(path, f"cannot decode pixel data ({type(exc).__name__}: {exc})") from exc
    if pixels.shape != (rows, columns):
        raise DicomSeriesError(path, f"pixel data shape {pixels.shape} != Rows x Columns ({rows}, {columns})")
    with np.errstate(over="ignore", invalid="ignore"):  # checked on the next line
        hu = pixels.astype(np.float32) * np.float32(slope) + np.float32(intercept)
    if not np.all(np.isfinite(hu)):
        raise DicomSeriesError(path, f"HU values are not finite (RescaleSlope {slope:g}, RescaleIntercept "
                                     f"{intercept:g} overflow float32)")
    return DecodedSlice(str(ds.get("SeriesInstanceUID", "")), orientation, position, spacing, thickness, hu)


def _check_same(name: str, values: list[np.ndarray], files: list[Path], atol: float) -> None:
    """Raise naming the first file whose ``name`` differs from the first file's."""
    for value, path in zip(values[1:], files[1:]):
        if value.shape != values[0].shape or not np.allclose(value, values[0], atol=atol, rtol=0.0):
            raise DicomSeriesError(
                path, f"inconsistent {name} in the series: {value.tolist()} vs {values[0].tolist()} in {files[0].name}"
            )


def read_dicom_series(folder: Path, *, spacing_tolerance: float = 0.02,
                      decoded: Mapping[str, DecodedSlice] | None = None) -> CTVolume:
    """Read a CT DICOM series folder into a sorted HU volume.

    Parameters
    ----------
    folder : Path
        Folder holding exactly one series, one slice per file (any file name;
        hidden files are skipped).
    spacing_tolerance : float, optional
        Largest allowed relative deviation of a slice step from the median
        step (plus 0.01 mm for float rounding). Default 2 %.
    decoded : mapping of str to DecodedSlice, optional
        Slices already decoded (:func:`decode_slice`) by file name: those files are
        not read again; the folder's other files are.

    Returns
    -------
    CTVolume
        The volume, slices in ascending order along the slice normal.

    Raises
    ------
    DicomSeriesError
        On an empty or missing folder; an unreadable, non-DICOM or non-image
        file; slices of different series, orientation, size or pixel spacing;
        positions off the normal axis; duplicate slice positions; a missing
        slice (a step larger than 1.5 x the median step); uneven steps; a
        Modality other than CT; a header value of the wrong count or type
        (e.g. ImagePositionPatient with 2 values, a multi-valued
        RescaleSlope); a non-finite RescaleSlope/Intercept or HU value; a
        RescaleSlope of 0; more
        than :data:`MAX_SLICES` files or more than :data:`MAX_SLICE_PIXELS`
        pixels in a slice.
    """
    folder = Path(folder)
    files = list_series_files(folder)
    if len(files) > MAX_SLICES:
        raise DicomSeriesError(folder, f"{len(files)} files in the series folder, over the limit of "
                                       f"{MAX_SLICES} slices (MAX_SLICES)")
    known = decoded or {}
    slices = [known[path.name] if path.name in known else _read_slice(path) for path in files]

    for item, path in zip(slices, files):
        if item.uid != slices[0].uid:
            raise DicomSeriesError(path, f"belongs to another series ({item.uid} vs {slices[0].uid} "
                                         f"in {files[0].name})")

    orientations = [item.orientation for item in slices]
    _check_same("ImageOrientationPatient", orientations, files, _ORIENTATION_ATOL)
    _check_same("Rows x Columns", [np.asarray(item.hu.shape) for item in slices], files, 0.0)
    spacings = [item.spacing for item in slices]
    _check_same("PixelSpacing", spacings, files, _SPACING_ATOL_MM)
    dy, dx = (float(v) for v in spacings[0])
    if dy <= 0 or dx <= 0:
        raise DicomSeriesError(files[0], f"PixelSpacing must be positive, got {spacings[0].tolist()}")

    orientation = orientations[0]
    normal = np.cross(orientation[:3], orientation[3:])
    norm = float(np.linalg.norm(normal))
    if norm < 1e-3:
        raise DicomSeriesError(files[0], f"degenerate ImageOrientationPatient {orientation.tolist()}")
    normal /= norm
    positions = np.asarray([item.position for item in slices])
    along = positions @ normal
    order = np.argsort(along, kind="stable")
    along = along[order]
    positions = positions[order]
    files = [files[i] for i in order]
    slices = [slices[i] for i in order]

    # Positions must differ only along the normal (no gantry tilt, no mixed stacks).
    off_axis = positions - positions[0] - np.outer(along - along[0], normal)
    worst = int(np.argmax(np.linalg.norm(off_axis, axis=1)))
    if np.linalg.norm(off_axis[worst]) > 0.5 * min(dx, dy):
        raise DicomSeriesError(
            files[worst],
            "ImagePositionPatient is off the slice-normal axis of the series (gantry tilt or mixed stacks)",
        )

    steps = np.diff(along)
    for k, step in enumerate(steps):
        if step < DUPLICATE_TOLERANCE_MM:
            raise DicomSeriesError(
                files[k + 1], f"duplicate slice position {along[k + 1]:.3f} mm (same as {files[k].name})"
            )
    if len(steps) == 0:
        dz = slices[0].thickness
    else:
        dz = float(np.median(steps))
        for k, step in enumerate(steps):
            if step > MISSING_SLICE_FACTOR * dz:
                raise DicomSeriesError(
                    folder,
                    f"missing slice(s) between {files[k].name} ({along[k]:.3f} mm) and {files[k + 1].name} "
                    f"({along[k + 1]:.3f} mm): step {step:.3f} mm vs median step {dz:.3f} mm",
                )
        tolerance = spacing_tolerance * dz + 0.01
        for k, step in enumerate(steps):
            if abs(step - dz) > tolerance:
                raise DicomSeriesError(
                    files[k + 1],
                    f"inconsistent slice spacing: step {step:.3f} mm from {files[k].name} vs median step {dz:.3f} mm",
                )

    hu = np.stack([item.hu for item in slices]).astype(np.float32, copy=False)
    return CTVolume(
        hu=hu,
        spacing=(dz, dy, dx),
        origin=tuple(float(v) for v in positions[0]),  # type: ignore[arg-type]
        orientation=tuple(float(v) for v in orientation),
    )
