"""Write a [0, 1] display image as a real radiograph file: PNG (8/16 bit) or DX DICOM.

The file kinds (:data:`FILE_KINDS`) cover every reader path of
:mod:`clients.io.radiograph`: 8- and 16-bit grey PNG, DICOM MONOCHROME2 with
12 bits stored, a rescale and a window, MONOCHROME1 with 16 bits, and
JPEG-baseline DICOM (8 bits). UIDs are deterministic (from ``uid_seed``).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.encaps import encapsulate
from pydicom.uid import (
    DigitalXRayImageStorageForPresentation,
    ExplicitVRLittleEndian,
    JPEGBaseline8Bit,
    generate_uid,
)

from clients.io.dicom_writer import set_synthetic_patient

__all__ = ["FILE_KINDS", "write_radiograph"]

#: How an image is stored: 8-bit PNG, 16-bit PNG, DICOM MONOCHROME2 (12 bits stored,
#: rescale slope/intercept and a window), DICOM MONOCHROME1 (16 bits) and
#: JPEG-baseline-compressed DICOM (8 bits).
FILE_KINDS = ("png8", "png16", "dicom-mono2", "dicom-mono1", "dicom-jpeg")
#: Stored values of the DICOM kinds: MONOCHROME2 uses 12 bits, MONOCHROME1 all 16.
_MONO2_RANGE = (100.0, 3900.0)
_MONO1_RANGE = (2000.0, 62000.0)
_MONO2_SLOPE, _MONO2_INTERCEPT = 2.0, -200.0


def _dx_dataset(image_id: str, uid_seed: int, rows: int, columns: int) -> Dataset:
    """A DX For-Presentation dataset without the pixel module (deterministic UIDs)."""
    token = str(uid_seed)
    sop_uid = generate_uid(entropy_srcs=[token, "instance"])
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = DigitalXRayImageStorageForPresentation
    meta.MediaStorageSOPInstanceUID = sop_uid
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = DigitalXRayImageStorageForPresentation
    ds.SOPInstanceUID = sop_uid
    ds.StudyInstanceUID = generate_uid(entropy_srcs=[token, "study"])
    ds.SeriesInstanceUID = generate_uid(entropy_srcs=[token, "series"])
    ds.ImageType = ["DERIVED", "PRIMARY"]
    ds.Modality = "DX"
    set_synthetic_patient(ds, image_id)
    ds.StudyID = "1"
    ds.SeriesNumber = 1
    ds.InstanceNumber = 1
    ds.BodyPartExamined = "CHEST"
    ds.ViewPosition = "PA"
    ds.PatientOrientation = ["L", "F"]
    ds.PresentationIntentType = "FOR PRESENTATION"
    ds.ImagerPixelSpacing = ["0.3", "0.3"]
    ds.SamplesPerPixel = 1
    ds.Rows, ds.Columns = rows, columns
    ds.PixelRepresentation = 0
    return ds


def _window(ds: Dataset, low: float, high: float) -> None:
    """Set a window that shows ``[low, high]`` (output values) with a 5 % margin."""
    ds.WindowCenter = f"{(low + high) / 2:.1f}"
    ds.WindowWidth = f"{(high - low) * 1.05:.1f}"


def write_radiograph(path: Path, image: np.ndarray, kind: str, *, image_id: str, uid_seed: int) -> Path:
    """Store a [0, 1] display image as a real PNG or DICOM file.

    Parameters
    ----------
    path : Path
        Output file (its suffix is not changed; use ``.png`` or ``.dcm``).
    image : np.ndarray
        ``(h, w)`` display values in [0, 1], dense = bright.
    kind : str
        One of :data:`FILE_KINDS`:

        - ``"png8"``: 8-bit grey PNG.
        - ``"png16"``: 16-bit grey PNG.
        - ``"dicom-mono2"``: DX, MONOCHROME2, 12 of 16 bits stored,
          RescaleSlope 2 / RescaleIntercept -200, a window over the data.
        - ``"dicom-mono1"``: DX, MONOCHROME1 (stored values inverted: the
          reader must flip them), 16 bits stored, Presentation LUT Shape INVERSE.
        - ``"dicom-jpeg"``: DX, MONOCHROME2, 8 bits, JPEG baseline (Pillow,
          quality 95), encapsulated.
    image_id : str
        Synthetic patient id (DICOM only).
    uid_seed : int
        Entropy for the DICOM UIDs.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    ValueError
        On an unknown kind or an image that is not 2D.
    """
    if kind not in FILE_KINDS:
        raise ValueError(f"unknown file kind {kind!r}; expected one of {FILE_KINDS}")
    image = np.clip(np.asarray(image, dtype=np.float64), 0.0, 1.0)
    if image.ndim != 2:
        raise ValueError(f"image must be 2D, got shape {image.shape}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "png8":
        Image.fromarray(np.rint(image * 255).astype(np.uint8)).save(path, format="PNG")
        return path
    if kind == "png16":
        Image.fromarray(np.rint(image * 65535).astype(np.uint16)).save(path, format="PNG")
        return path

    rows, columns = image.shape
    ds = _dx_dataset(image_id, uid_seed, rows, columns)
    if kind == "dicom-jpeg":
        buffer = io.BytesIO()
        Image.fromarray(np.rint(image * 255).astype(np.uint8)).save(buffer, format="JPEG", quality=95)
        ds.file_meta.TransferSyntaxUID = JPEGBaseline8Bit
        ds.PhotometricInterpretation = "MONOCHROME2"
        ds.PresentationLUTShape = "IDENTITY"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit = 8, 8, 7
        ds.LossyImageCompression = "01"
        ds.LossyImageCompressionMethod = "ISO_10918_1"
        ds.PixelData = encapsulate([buffer.getvalue()])
        ds["PixelData"].VR = "OB"
    elif kind == "dicom-mono2":
        low, high = _MONO2_RANGE
        stored = np.rint(low + image * (high - low)).astype("<u2")
        ds.PhotometricInterpretation = "MONOCHROME2"
        ds.PresentationLUTShape = "IDENTITY"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit = 16, 12, 11
        ds.RescaleSlope = f"{_MONO2_SLOPE:g}"
        ds.RescaleIntercept = f"{_MONO2_INTERCEPT:g}"
        ds.RescaleType = "US"
        _window(ds, low * _MONO2_SLOPE + _MONO2_INTERCEPT, high * _MONO2_SLOPE + _MONO2_INTERCEPT)
        ds.PixelData = stored.tobytes()
    else:  # dicom-mono1: the minimum stored value is displayed white
        low, high = _MONO1_RANGE
        stored = np.rint(high - image * (high - low)).astype("<u2")
        ds.PhotometricInterpretation = "MONOCHROME1"
        ds.PresentationLUTShape = "INVERSE"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit = 16, 16, 15
        _window(ds, low, high)
        ds.PixelData = stored.tobytes()
    ds.save_as(path, enforce_file_format=True)
    return path
