"""Read one chest radiograph (PNG/JPEG or DICOM) as a square ``float32`` image in [0, 1].

Every file goes through the same display pipeline, so images from sites that
export PNG, plain DICOM or compressed DICOM look alike to the network:

1. **Decode.** The format is recognised from the file's content (the ``DICM``
   marker at byte 128, or a ``.dcm``/``.dicom`` name for DICOM files written
   without a preamble), not trusted from the extension. PNG, JPEG and the other
   raster formats go through Pillow (8- or 16-bit grey; colour and palette
   images are converted to luma with ITU-R BT.601 weights). DICOM goes through
   pydicom; compressed transfer syntaxes are decoded by pydicom's pixel-data
   plugins (JPEG baseline needs Pillow or pylibjpeg; Pillow, which this
   module needs anyway, is enough).
2. **DICOM display transforms** (DICOM PS3.3 C.11, the grayscale standard
   display pipeline): the Modality LUT or Rescale Slope/Intercept
   (:func:`pydicom.pixels.apply_modality_lut`), then the first VOI LUT or
   window (:func:`pydicom.pixels.apply_voi_lut`, a VOI LUT sequence preferred
   over a window), then the inversion of ``MONOCHROME1`` images (where the
   minimum pixel value is meant to be displayed white), so that dense tissue
   (bone, mediastinum) is always bright and aerated lung dark. The
   Presentation LUT Shape is not applied on top: in DX/CR objects it only
   restates the photometric interpretation (``INVERSE`` for ``MONOCHROME1``),
   and applying both would flip the image twice.
3. **Intensity.** Per-image min-max scaling of the display values to [0, 1], so
   bit depth, exposure offset and window width do not matter (a constant image
   is rejected as unusable).
4. **Geometry.** Aspect-preserving resize of the longer side to ``size``
   (Pillow, bilinear with an antialiasing support that widens with the
   downscale factor), centred, the shorter side padded with 0 (black, like the
   air around the patient). Nothing is cropped, so a finding at the lateral
   lung edge (pneumothorax) is never cut away. CheXNet (Rajpurkar et al. 2017)
   resized the square 1024 px ChestX-ray14 images to 224; for those square
   images both choices are identical.

References
----------
Rajpurkar et al., "CheXNet: radiologist-level pneumonia detection on chest
X-rays with deep learning", arXiv:1711.05225, 2017.
NEMA, DICOM PS3.3, sec. C.11 (LUTs) and C.7.6.3.1.2 (photometric interpretation).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
from PIL import Image
from pydicom.pixels import apply_modality_lut, apply_voi_lut

from clients.errors import RadiographError

__all__ = ["RadiographError", "read_radiograph", "to_square", "MIN_SIDE", "MAX_PIXELS", "MODALITIES", "DICOM_SUFFIXES"]

#: Smallest accepted image side (pixels); anything smaller is not a radiograph.
MIN_SIDE = 8
#: Most pixels (width x height) an image may have; checked before its pixels are decoded.
MAX_PIXELS = 6144 * 6144
#: DICOM Modality values read as a radiograph (CT: a scout / localizer image).
MODALITIES = ("DX", "CR", "CT")
#: File names read as DICOM even without the ``DICM`` preamble.
DICOM_SUFFIXES = (".dcm", ".dicom")
_MONOCHROME = ("MONOCHROME1", "MONOCHROME2")


def read_radiograph(path: Path, size: int = 224) -> np.ndarray:
    """Read a chest radiograph as a ``(size, size)`` ``float32`` image in [0, 1].

    Parameters
    ----------
    path : Path
        A PNG/JPEG (any raster format Pillow reads) or DICOM file.
    size : int, optional
        Output side in pixels. Default 224 (the DenseNet-121 input of CheXNet).

    Returns
    -------
    np.ndarray
        ``float32`` ``(size, size)`` in [0, 1], bright = dense tissue; the
        display values are min-max scaled before the resize, the padding is 0.
        See the module docstring for the pipeline.

    Raises
    ------
    RadiographError
        If the file is missing, unreadable or corrupt, cannot be decoded (for
        example a compressed transfer syntax without a decoder), is a
        multi-frame or colour DICOM, has an unsupported photometric
        interpretation or a Modality outside :data:`MODALITIES`, is not 2D,
        is smaller than :data:`MIN_SIDE` or larger than :data:`MAX_PIXELS`,
        or is constant (or not finite after the DICOM transforms). The
        message names the file and the reason.
    ValueError
        If ``size < MIN_SIDE``.
    """
    if size < MIN_SIDE:
        raise ValueError(f"size must be >= {MIN_SIDE}, got {size}")
    path = Path(path)
    if not path.is_file():
        raise RadiographError(path, "file not found")
    if _is_dicom(path):
        display = _read_dicom_display(path)
    else:
        display = _read_raster_display(path)
    if display.ndim != 2:
        raise RadiographError(path, f"expected a 2D image, got shape {display.shape}")
    if min(display.shape) < MIN_SIDE:
        raise RadiographError(path, f"image {display.shape[1]}x{display.shape[0]} is smaller than {MIN_SIDE} px")
    if not np.isfinite(display).all():
        raise RadiographError(path, "pixel values are not finite")
    low, high = float(display.min()), float(display.max())
    if high <= low:
        raise RadiographError(path, f"constant image (every pixel is {low:g}); nothing to read")
    scaled = ((display - low) / (high - low)).astype(np.float32)
    return to_square(scaled, size)


def to_square(image: np.ndarray, size: int) -> np.ndarray:
    """Resize a 2D image to ``(size, size)`` keeping its aspect ratio, zero-padded.

    Parameters
    ----------
    image : np.ndarray
        ``(h, w)`` values in [0, 1].
    size : int
        Output side.

    Returns
    -------
    np.ndarray
        ``float32`` ``(size, size)`` in [0, 1]: the longer side fills ``size``,
        the shorter side is centred and padded with 0.
    """
    h, w = image.shape
    scale = size / max(h, w)
    new_h, new_w = max(1, round(h * scale)), max(1, round(w * scale))
    if (new_h, new_w) != (h, w):
        resized = Image.fromarray(np.ascontiguousarray(image, dtype=np.float32)).resize(
            (new_w, new_h), Image.Resampling.BILINEAR
        )
        image = np.asarray(resized, dtype=np.float32)
    out = np.zeros((size, size), dtype=np.float32)
    top, left = (size - new_h) // 2, (size - new_w) // 2
    out[top : top + new_h, left : left + new_w] = np.clip(image, 0.0, 1.0)
    return out


def _is_dicom(path: Path) -> bool:
    """True for a DICOM Part 10 file (``DICM`` at byte 128) or a DICOM-named file."""
    try:
        with path.open("rb") as handle:
            head = handle.read(132)
    except OSError as exc:
        raise RadiographError(path, f"cannot open the file ({type(exc).__name__}: {exc})") from exc
    return head[128:132] == b"DICM" or path.suffix.lower() in DICOM_SUFFIXES


def _check_pixels(path: Path, width: int, height: int) -> None:
    """Refuse an image of more than :data:`MAX_PIXELS` pixels (before decoding it)."""
    if width * height > MAX_PIXELS:
        raise RadiographError(path, f"image {width}x{height} is over the limit of {MAX_PIXELS} pixels (MAX_PIXELS)")


def _read_raster_display(path: Path) -> np.ndarray:
    """Decode a PNG/JPEG/... with Pillow into a float64 grey image (display values)."""
    try:
        with Image.open(path) as image:
            _check_pixels(path, image.width, image.height)
            image.load()
            if getattr(image, "n_frames", 1) > 1:
                raise RadiographError(path, f"{image.format} with {image.n_frames} frames is not a single radiograph")
            if image.mode in ("I;16", "I;16B", "I;16L", "I", "F", "L"):
                pixels = np.asarray(image)
            elif image.mode == "LA":
                pixels = np.asarray(image.getchannel("L"))
            else:  # RGB, RGBA, P, CMYK, 1, YCbCr, ...: convert to 8-bit luma (ITU-R 601-2)
                pixels = np.asarray(image.convert("L"))
    except RadiographError:
        raise
    except Exception as exc:  # Pillow raises OSError, SyntaxError, ValueError... on corrupt data
        raise RadiographError(path, f"not a readable image ({type(exc).__name__}: {exc})") from exc
    return pixels.astype(np.float64)


def _read_dicom_display(path: Path) -> np.ndarray:
    """Decode a DICOM radiograph and apply Modality LUT, VOI LUT/window and MONOCHROME1 inversion."""
    try:
        ds = pydicom.dcmread(path, force=True)
    except Exception as exc:  # InvalidDicomError, EOFError, struct.error, ...
        raise RadiographError(path, f"not a readable DICOM file ({type(exc).__name__}: {exc})") from exc
    if "PixelData" not in ds:
        raise RadiographError(path, "DICOM file has no pixel data (PixelData is missing)")
    modality = str(ds.get("Modality", "") or "").strip().upper()
    if modality not in MODALITIES:
        raise RadiographError(path, f"Modality is {modality or 'missing'}; a radiograph has Modality "
                                    f"{', '.join(MODALITIES)}")
    try:
        frames = int(ds.get("NumberOfFrames", 1) or 1)
        samples = int(ds.get("SamplesPerPixel", 1) or 1)
        rows, columns = int(ds.get("Rows", 0) or 0), int(ds.get("Columns", 0) or 0)
    except (TypeError, ValueError) as exc:
        raise RadiographError(path, f"malformed NumberOfFrames, SamplesPerPixel, Rows or Columns ({exc})") from exc
    if frames > 1:
        raise RadiographError(path, f"multi-frame DICOM ({frames} frames) is not a single radiograph")
    _check_pixels(path, columns, rows)
    photometric = str(ds.get("PhotometricInterpretation", "")).strip().upper()
    if samples != 1 or photometric not in _MONOCHROME:
        raise RadiographError(
            path,
            f"unsupported DICOM colour model (SamplesPerPixel={samples}, "
            f"PhotometricInterpretation={photometric or 'missing'}); a radiograph is MONOCHROME1 or MONOCHROME2",
        )
    syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    try:
        stored = ds.pixel_array
    except Exception as exc:  # missing decoder plugin, truncated or corrupt pixel data
        name = getattr(syntax, "name", None) or "unknown transfer syntax"
        raise RadiographError(path, f"cannot decode the pixel data ({name}; {type(exc).__name__}: {exc})") from exc
    if stored.ndim != 2:
        raise RadiographError(path, f"expected a 2D DICOM image, got pixel array shape {stored.shape}")
    try:
        # The VOI LUT indexes by the (integer) modality output: no float cast before it.
        values = apply_voi_lut(apply_modality_lut(stored, ds), ds, index=0, prefer_lut=True)
    except Exception as exc:  # malformed LUT descriptor, zero window width, ...
        raise RadiographError(path, f"invalid Modality/VOI LUT or window ({type(exc).__name__}: {exc})") from exc
    values = np.asarray(values, dtype=np.float64)
    if photometric == "MONOCHROME1":
        values = values.max() + values.min() - values
    return values
