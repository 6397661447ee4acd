"""A predicted mask as a DICOM Segmentation (DICOM PS3.3 A.51, Segmentation IOD), made with highdicom.

One SEG instance per study, in a series of its own, in the source's study: it copies
the source series' Patient, General Study and Frame of Reference (A.51: the SEG
shares the images' frame of reference), has one frame per source slice (frame ``k``
is derived from source instance ``k``, Derivation Image / Source Image Sequence,
PS3.3 C.7.6.16.2.6; the plane positions are the sources'), and holds one segment,
``BINARY`` (PS3.3 C.8.20.2, Segmentation Image Module), whose Segment Description
names the finding with SNOMED CT codes (PS3.16 CID 7150 category, CID 7151 type:
Morphologically abnormal structure / Pulmonary embolism for ``pe-seg``), the
segment algorithm type ``AUTOMATIC`` and the model in its Segmentation Algorithm
Identification Sequence (PS3.3 10.16: name, version, family DCM 123110 Artificial
Intelligence, source). The model's name and version are also the Content Creator's
Name (family / given name component) and the Content Description; the product is
the Manufacturer with its version in Software Versions.
Empty frames are kept (``omit_empty_frames=False``) so every source slice has its
frame and the mask reads back voxel for voxel (``highdicom.seg.segread`` then
``get_pixels_by_source_instance``).

:class:`SegmentationContent` is what the segmentation predictor hands ``make predict``
(:attr:`clients.prediction.predictor.ItemResult.dicom`); its :meth:`~SegmentationContent.dataset`
is the ``highdicom.seg.Segmentation`` (a ``pydicom.Dataset``) that ``make predict``
saves and a PACS client can send as it is (STOW-RS, C-STORE).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import highdicom as hd
import numpy as np
from pydicom.dataset import Dataset
from pydicom.sr.codedict import codes
from pydicom.sr.coding import Code
from pydicom.valuerep import PersonName

from clients.errors import DicomResultError
from clients.prediction.dicom_source import MANUFACTURER, ModelIdentity, read_source_instances

__all__ = ["SEG_SERIES_NUMBER", "SegmentTerms", "PULMONARY_EMBOLISM", "SegmentationContent",
           "segmentation"]

#: Series Number of the SEG series (one per study; the source series keep theirs).
SEG_SERIES_NUMBER = 901


@dataclass(frozen=True)
class SegmentTerms:
    """What a segment is (PS3.3 C.8.20.2.1 Segment Description; PS3.16 CID 7150 / 7151).

    Attributes
    ----------
    label : str
        Segment Label (LO).
    category : Code
        Segmented Property Category.
    property_type : Code
        Segmented Property Type.
    """

    label: str
    category: Code
    property_type: Code


#: ``pe-seg``'s segment: a pulmonary embolism (SCT 59282003), a morphologically abnormal structure.
PULMONARY_EMBOLISM = SegmentTerms("Pulmonary embolism", codes.SCT.MorphologicallyAbnormalStructure,
                                  codes.SCT.PulmonaryEmbolism)


def _check_fits(mask: np.ndarray, instances: list[Dataset], source: Path) -> None:
    """Raise :class:`DicomResultError` naming ``source`` when ``mask`` is not one frame per slice."""
    if mask.ndim != 3:
        raise DicomResultError(source, f"the mask has {mask.ndim} dimensions; a SEG frame per "
                                       "source slice needs (slices, rows, columns)")
    sizes = {(int(ds.get("Rows", 0)), int(ds.get("Columns", 0))) for ds in instances}
    if len(instances) != mask.shape[0] or sizes != {tuple(mask.shape[1:])}:
        shown = ", ".join(f"{r} x {c}" for r, c in sorted(sizes))
        raise DicomResultError(source, f"the series has {len(instances)} slice(s) of {shown} "
                                       f"(rows x columns) but the mask is {mask.shape[0]} x "
                                       f"{mask.shape[1]} x {mask.shape[2]}; no SEG written")


def segmentation(mask: np.ndarray, instances: list[Dataset], segment: SegmentTerms,
                 identity: ModelIdentity, source: Path) -> hd.seg.Segmentation:
    """The DICOM-SEG of a binary ``mask`` over the source series ``instances`` (PS3.3 A.51).

    Parameters
    ----------
    mask : np.ndarray
        ``(slices, rows, columns)``, nonzero inside the segment; slice ``k`` is on ``instances[k]``.
    instances : list of Dataset
        The source series in slice order (:func:`~clients.prediction.dicom_source.read_source_instances`).
    segment : SegmentTerms
        What the segment is.
    identity : ModelIdentity
        The model that predicted it.
    source : Path
        The source series folder (named in errors).

    Raises
    ------
    DicomResultError
        If the mask does not have one frame per source slice of the slices' size, or
        highdicom refuses the sources (their geometry or modules), naming ``source``.
    """
    _check_fits(mask, instances, source)
    algorithm = hd.AlgorithmIdentificationSequence(
        name=identity.name, family=codes.cid7162.ArtificialIntelligence, version=identity.version,
        source=identity.source)
    description = hd.seg.SegmentDescription(
        segment_number=1, segment_label=segment.label, segmented_property_category=segment.category,
        segmented_property_type=segment.property_type,
        algorithm_type=hd.seg.SegmentAlgorithmTypeValues.AUTOMATIC,
        algorithm_identification=algorithm, tracking_uid=hd.UID(), tracking_id=segment.label)
    creator = PersonName.from_named_components(family_name=identity.name,
                                               given_name=f"version {identity.version}")
    try:
        return hd.seg.Segmentation(
            source_images=instances, pixel_array=(mask > 0).astype(np.uint8),
            segmentation_type=hd.seg.SegmentationTypeValues.BINARY,
            segment_descriptions=[description], series_instance_uid=hd.UID(),
            series_number=SEG_SERIES_NUMBER, sop_instance_uid=hd.UID(), instance_number=1,
            manufacturer=MANUFACTURER, manufacturer_model_name=identity.name,
            software_versions=identity.software_version, device_serial_number=identity.version,
            content_description=f"{segment.label} by {identity.name} {identity.version}"[:64],
            content_creator_name=creator, content_label=_content_label(segment.label),
            omit_empty_frames=False)
    except (ValueError, AttributeError, TypeError) as exc:
        raise DicomResultError(source, f"no SEG: highdicom refused the source series "
                                       f"({type(exc).__name__}: {exc})") from None


def _content_label(label: str) -> str:
    """A Content Label (CS: upper case, digits, space, underscore; 16 characters) from ``label``."""
    return re.sub(r"[^A-Z0-9_ ]+", "_", label.upper())[:16].strip() or "SEGMENTATION"


@dataclass(frozen=True, eq=False)
class SegmentationContent:
    """One study's predicted mask and its source series: what its DICOM-SEG is made of.

    Attributes
    ----------
    mask : np.ndarray
        ``uint8`` ``(slices, rows, columns)`` on the series' own grid, slices ascending along
        the slice normal (as :func:`clients.io.dicom_series.read_dicom_series` reads them).
    source : Path
        The DICOM series folder.
    segment : SegmentTerms
        What the segment is.
    """

    mask: np.ndarray
    source: Path
    segment: SegmentTerms = PULMONARY_EMBOLISM

    #: The kind of object and the suffix of its file in ``make predict``'s ``dicom/`` folder.
    kind = "SEG"
    suffix = ".seg.dcm"

    def dataset(self, identity: ModelIdentity) -> hd.seg.Segmentation:
        """The SEG (see :func:`segmentation`), its source instances read from :attr:`source`.

        Raises
        ------
        DicomResultError
            If the source is not a DICOM series or does not fit the mask (names it).
        """
        return segmentation(self.mask, read_source_instances(self.source), self.segment,
                            identity, self.source)
