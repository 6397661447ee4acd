"""Write an axial HU volume as a DICOM CT Image Storage series (one file per slice).

The writer of every CT series the product creates: the synthetic PE and 3D CT
hospitals and the shared-set converters (``ctpa``, ``msd-lung``). Values are
stored as 12-bit unsigned integers through the modality LUT (DICOM PS3.3
C.11.1.1.2), UIDs are deterministic, so a generator's output is a function of
its seed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

from clients.io.dicom_series import CTVolume

__all__ = ["RESCALE_INTERCEPT", "set_synthetic_patient", "write_dicom_series"]

#: Stored value = HU - RESCALE_INTERCEPT (12-bit unsigned, like many scanners).
RESCALE_INTERCEPT = -1024.0
#: Elements :func:`write_dicom_series` derives from the volume (never overridden by ``header``).
_PROTECTED_ELEMENTS = frozenset({
    "ImageOrientationPatient", "ImagePositionPatient", "PixelSpacing", "SliceThickness", "SliceLocation",
    "Rows", "Columns", "PixelData", "BitsAllocated", "BitsStored", "HighBit", "PixelRepresentation",
    "SamplesPerPixel", "PhotometricInterpretation", "RescaleSlope", "RescaleIntercept", "InstanceNumber",
})


def set_synthetic_patient(ds: Dataset, patient_id: str) -> None:
    """Set the patient and study identification of a generated image: no real person, fixed date.

    ``PatientName`` is ``SYNTHETIC^<patient_id>``, the manufacturer ``SYNTHETIC``;
    the other type-2 elements (birth date, accession number, referring
    physician) are present and empty.
    """
    ds.Manufacturer = "SYNTHETIC"
    ds.StudyDate = "20240101"
    ds.StudyTime = "120000"
    ds.AccessionNumber = ""
    ds.ReferringPhysicianName = ""
    ds.PatientName = f"SYNTHETIC^{patient_id}"
    ds.PatientID = patient_id
    ds.PatientBirthDate = ""
    ds.PatientSex = "O"


def _ds(value: float) -> str:
    """Format a number as a DICOM Decimal String (<= 16 characters)."""
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return text if len(text) <= 16 else f"{value:.8g}"


def write_dicom_series(
    folder: Path,
    volume: CTVolume,
    *,
    patient_id: str,
    uid_seed: int,
    description: str = "Synthetic CTPA",
    rescale_slope: float = 1.0,
    rescale_intercept: float = RESCALE_INTERCEPT,
    header: Mapping[str, object] | None = None,
) -> list[Path]:
    """Write an axial HU volume as a CT Image Storage series, one file per slice.

    Stored values are ``uint16`` ``(HU - RescaleIntercept) / RescaleSlope``
    rounded to integers, 12 bits stored (by default slope 1 and intercept
    -1024, i.e. ``HU + 1024``), so the reader's modality LUT ``stored * slope +
    intercept`` gives the volume back. Explicit VR Little Endian with a proper
    file meta header. UIDs come from :func:`pydicom.uid.generate_uid` with
    entropy from ``uid_seed``, so they are deterministic. File names are a hash
    of the SOP Instance UID (no extension), i.e. unrelated to slice order.

    Parameters
    ----------
    folder : Path
        Output folder (created; must not hold other files).
    volume : CTVolume
        Volume with integer HU values in [-1024, 3071] and axial orientation.
    patient_id : str
        Synthetic patient id.
    uid_seed : int
        Entropy for the Study/Series/Frame-of-reference/SOP UIDs.
    description : str, optional
        SeriesDescription.
    rescale_slope, rescale_intercept : float, optional
        The modality LUT (DICOM PS3.3 C.11.1.1.2). A slope other than 1 stores
        non-integer values exactly when they lie on the grid
        ``intercept + slope * k`` (e.g. pre-normalised intensities mapped to a window).
    header : mapping, optional
        Extra or overriding data elements by keyword (e.g. ``Manufacturer``,
        ``PatientName``, ``ImageComments``, ``RescaleType``), set on every slice;
        the geometry, pixel and UID elements cannot be overridden.

    Returns
    -------
    list of Path
        The written files, in slice order.

    Raises
    ------
    ValueError
        If a stored value falls outside the 12-bit range [0, 4095], the slope
        is not positive, or ``header`` names a geometry/pixel/UID element.
    """
    folder = Path(folder)
    if not rescale_slope > 0:
        raise ValueError(f"{folder}: rescale_slope must be > 0, got {rescale_slope}")
    for keyword in header or {}:
        if keyword in _PROTECTED_ELEMENTS or keyword.endswith("UID"):
            raise ValueError(f"{folder}: header may not override {keyword}")
    stored = np.rint((volume.hu - rescale_intercept) / rescale_slope)
    if stored.min() < 0 or stored.max() > 4095:
        low, high = rescale_intercept, rescale_intercept + 4095 * rescale_slope
        raise ValueError(f"{folder}: values must lie in [{low:g}, {high:g}] (12 bits stored)")
    folder.mkdir(parents=True, exist_ok=True)
    stored = stored.astype("<u2")
    token = str(uid_seed)
    study_uid = generate_uid(entropy_srcs=[token, "study"])
    series_uid = generate_uid(entropy_srcs=[token, "series"])
    frame_uid = generate_uid(entropy_srcs=[token, "frame-of-reference"])
    dz, dy, dx = volume.spacing
    normal = volume.slice_normal
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = CTImageStorage
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = CTImageStorage
    ds.ImageType = ["DERIVED", "SECONDARY", "AXIAL"]
    ds.Modality = "CT"
    set_synthetic_patient(ds, patient_id)
    ds.StudyInstanceUID = study_uid
    ds.SeriesInstanceUID = series_uid
    ds.FrameOfReferenceUID = frame_uid
    ds.PositionReferenceIndicator = ""
    ds.StudyID = "1"
    ds.SeriesNumber = 1
    ds.SeriesDescription = description
    ds.BodyPartExamined = "CHEST"
    ds.ContrastBolusAgent = "SYNTHETIC IODINE"
    ds.ImageOrientationPatient = [_ds(v) for v in volume.orientation]
    ds.SliceThickness = _ds(dz)
    ds.PixelSpacing = [_ds(dy), _ds(dx)]
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.Rows, ds.Columns = int(volume.shape[1]), int(volume.shape[2])
    ds.BitsAllocated = 16
    ds.BitsStored = 12
    ds.HighBit = 11
    ds.PixelRepresentation = 0
    ds.RescaleIntercept = _ds(rescale_intercept)
    ds.RescaleSlope = "1" if rescale_slope == 1.0 else f"{rescale_slope:.10g}"
    ds.RescaleType = "HU"
    ds.WindowCenter = "100"
    ds.WindowWidth = "700"
    for keyword, value in (header or {}).items():
        setattr(ds, keyword, value)
    paths = []
    for k in range(volume.shape[0]):
        # One dataset, re-used: only the per-slice attributes change.
        sop_uid = generate_uid(entropy_srcs=[token, "instance", str(k)])
        position = np.asarray(volume.origin) + k * dz * normal
        meta.MediaStorageSOPInstanceUID = sop_uid
        ds.SOPInstanceUID = sop_uid
        ds.InstanceNumber = k + 1
        ds.ImagePositionPatient = [_ds(v) for v in position]
        ds.SliceLocation = _ds(float(position @ normal))
        ds.PixelData = stored[k].tobytes()
        path = folder / hashlib.sha1(sop_uid.encode()).hexdigest()[:24]
        ds.save_as(path, enforce_file_format=True)
        paths.append(path)
    return paths
