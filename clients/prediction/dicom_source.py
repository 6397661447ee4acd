"""What a DICOM result of ``make predict`` is made from: the source instances and the model's identity.

A DICOM-SEG (:mod:`clients.prediction.dicom_seg`) and a TID 1500 measurement report
(:mod:`clients.prediction.dicom_sr`) belong to the patient's study in the PACS: they
copy the source's Patient and General Study modules (DICOM PS3.3 A.51 and A.35.13 both
include them) and reference every source instance (PS3.3 C.7.6.16.2.6 Derivation Image,
C.17.2 SR Document General: Current Requested Procedure Evidence). So they are made
only from a DICOM source: :func:`read_source_instances` reads a file or every file of
a series folder and refuses, naming the file, anything that is not DICOM (a PNG, a
NIfTI: it carries no Study Instance UID to attach a result to). A series' instances
are ordered as :func:`clients.io.dicom_series.read_dicom_series` orders its slices
(ascending ``ImagePositionPatient`` along the slice normal), so frame ``k`` of a
mask is the instance ``k`` read here.

:class:`ModelIdentity` is the model that made the result, as the SEG's Algorithm
Identification Sequence (PS3.3 C.8.20.2 / 10.16) and the SR's TID 4019 Algorithm
Identification and device observer (PS3.16 TID 1004) give it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pydicom
from pydicom.dataset import Dataset
from pydicom.errors import InvalidDicomError

from clients.errors import DicomResultError, DicomSeriesError
from clients.io.dicom_series import list_series_files

__all__ = ["MANUFACTURER", "ModelIdentity", "read_source_instances"]

#: The Manufacturer of every object the product writes (it is the device that made it).
MANUFACTURER = "fedmed"


@dataclass(frozen=True)
class ModelIdentity:
    """The model a result comes from (DICOM LO values: at most 64 characters each).

    Attributes
    ----------
    name : str
        Its name: the registered model's name (``fedmed-pe-seg-best``) or the logged model's.
    version : str
        Its version: the registered version, or the MLflow run that logged it.
    software_version : str
        The product's version that wrote the object (Software Versions).
    source : str
        Who made the algorithm (Algorithm Source).
    """

    name: str
    version: str
    software_version: str = "unknown"
    source: str = MANUFACTURER

    def __post_init__(self) -> None:
        for key in ("name", "version", "software_version", "source"):
            value = getattr(self, key)
            if not value or len(value) > 64 or "\\" in value:
                raise ValueError(f"model identity {key} {value!r}: 1 to 64 characters, no backslash "
                                 "(a DICOM LO value)")


def _read(path: Path) -> Dataset:
    """One source file's header (pixels are not needed to reference it)."""
    try:
        return pydicom.dcmread(path, stop_before_pixels=True)
    except InvalidDicomError:
        raise DicomResultError(path, "not a DICOM file (no DICM preamble); a DICOM result references "
                                     "DICOM source instances, so none is written for it") from None
    except (OSError, ValueError, EOFError) as exc:
        raise DicomResultError(path, f"unreadable DICOM file ({type(exc).__name__}: {exc})") from None


def _along_normal(instances: list[Dataset], folder: Path) -> list[Dataset]:
    """A series' instances ordered by ``ImagePositionPatient`` along the slice normal."""
    try:
        orientation = np.asarray(instances[0].ImageOrientationPatient, np.float64)
        normal = np.cross(orientation[:3], orientation[3:6])
        keys = [float(np.asarray(ds.ImagePositionPatient, np.float64) @ normal) for ds in instances]
    except (AttributeError, ValueError, IndexError):
        raise DicomResultError(folder, "a slice has no usable ImagePositionPatient / "
                                       "ImageOrientationPatient") from None
    return [instances[k] for k in np.argsort(keys, kind="stable")]


def read_source_instances(source: Path) -> list[Dataset]:
    """The DICOM instances of a source: a file, or every file of a series folder in slice order.

    Parameters
    ----------
    source : Path
        A DICOM file (a radiograph) or a DICOM series folder (one file per slice).

    Raises
    ------
    DicomResultError
        If ``source`` (or a file of the folder) is not DICOM or unreadable, or a folder's
        files belong to more than one series; the message names the file or folder.
    """
    source = Path(source)
    if not source.is_dir():
        if not source.is_file():
            raise DicomResultError(source, "no such file or folder")
        return [_read(source)]
    try:
        files = list_series_files(source)
    except DicomSeriesError as exc:
        raise DicomResultError(source, exc.reason) from None
    instances = [_read(path) for path in files]
    series = {str(ds.get("SeriesInstanceUID", "")) for ds in instances}
    if len(series) != 1:
        raise DicomResultError(source, f"holds {len(series)} series; a result references one")
    return _along_normal(instances, source) if len(instances) > 1 else instances
