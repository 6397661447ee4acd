"""Labels from DICOM-SEG objects in the PACS (``[labels] source = "seg"``): a study's mask
read from the SEG that references its chosen CT series.

For each study the sync has chosen and fetched the CT series (:mod:`clients.pacs.sync`);
then :func:`seg_mask`

1. lists the study's SEG series (Modality ``SEG``) and fetches their instances (not
   kept in the store: only the mask they give is);
2. keeps the SEGs whose Referenced Series Sequence names the chosen CT series: none while
   the study has SEGs skips it ("the SEG references series X, not the chosen CT series
   Y"), no SEG at all skips it ("missing label"), and so does more than one SEG
   referencing the series (which one is the label is not ours to guess);
3. takes its one segment, or the segment whose Segment Label is ``[labels] segment``
   (several segments and no ``segment`` key: skipped, naming the rule); a SEG in another
   frame of reference than the CT is skipped;
4. reads it with highdicom (:meth:`highdicom.seg.Segmentation.from_dataset`, what
   ``highdicom.seg.segread`` does with a file) frame by referenced source instance,
   in the CT volume's slice order (:func:`~clients.prediction.dicom_source.read_source_instances`,
   as :func:`~clients.io.dicom_series.read_dicom_series` sorts them): a CT slice the SEG
   has no frame for is empty (SEGs may omit empty frames). A ``BINARY`` segment is the
   mask where it is set, a ``FRACTIONAL`` one where it is at least 0.5.

The result is the ``(z, y, x)`` ``uint8`` 0/1 mask of the volume's grid, which the sync
writes as the NIfTI mask the manifest names (:func:`~clients.io.nifti.write_nifti_mask`).
Messages hold the study key and series UIDs: they are for the site's own report (the
audit log counts skipped studies, it never holds their reasons).
"""

from __future__ import annotations

from io import BytesIO
from pathlib import Path

import highdicom as hd
import numpy as np
import pydicom
from pydicom.dataset import Dataset

from clients.errors import DicomResultError
from clients.pacs.errors import StudySkipped
from clients.pacs.transport import PacsTransport, SeriesRecord
from clients.prediction.dicom_source import read_source_instances

__all__ = ["SEG_MODALITY", "seg_mask"]

SEG_MODALITY = "SEG"


def _referenced_series(seg: Dataset) -> set[str]:
    return {str(item.SeriesInstanceUID) for item in seg.get("ReferencedSeriesSequence", [])}


def _fetch_segs(transport: PacsTransport, study_uid: str, key: str) -> list[Dataset]:
    series: list[SeriesRecord] = transport.find_series(study_uid, SEG_MODALITY)
    if not series:
        raise StudySkipped(f"study {key}: missing label (no SEG series in the study; "
                           "labels.source = 'seg')")
    found: list[Dataset] = []
    for record in series:
        transport.fetch(study_uid, record.series_uid, None,
                        lambda raw: found.append(pydicom.dcmread(BytesIO(raw))))
    return found


def _segment_number(seg: hd.seg.Segmentation, wanted: str, key: str) -> int:
    segments = [(int(item.SegmentNumber), str(item.SegmentLabel)) for item in seg.SegmentSequence]
    if wanted:
        numbers = [number for number, label in segments if label == wanted]
        if len(numbers) != 1:
            raise StudySkipped(f"study {key}: the SEG holds {len(numbers)} segment(s) labelled "
                               f"{wanted!r} (labels.segment; its segments: "
                               f"{', '.join(label for _, label in segments)})")
        return numbers[0]
    if len(segments) != 1:
        raise StudySkipped(f"study {key}: the SEG holds {len(segments)} segments "
                           f"({', '.join(label for _, label in segments)}) and labels.segment "
                           "names none; set labels.segment to the segment's label")
    return segments[0][0]


def seg_mask(transport: PacsTransport, study_uid: str, ct_series_uid: str, ct_folder: Path,
             segment: str, key: str) -> np.ndarray:
    """The study's mask on its chosen CT series' grid from the SEG in the PACS (module docstring).

    Parameters
    ----------
    transport : PacsTransport
        The open connection to the PACS.
    study_uid, ct_series_uid : str
        The study and its chosen (fetched) CT series.
    ct_folder : Path
        The store's folder of that series.
    segment : str
        ``[labels] segment``: the Segment Label to take ("" : the SEG's one segment).
    key : str
        The study's key, named in the messages.

    Raises
    ------
    StudySkipped
        No SEG, a SEG of another series, several SEGs, an ambiguous or missing segment, or a
        SEG highdicom cannot read against the series: one line naming the study.
    """
    segs = _fetch_segs(transport, study_uid, key)
    matching = [ds for ds in segs if ct_series_uid in _referenced_series(ds)]
    if not matching:
        others = sorted(set().union(*(_referenced_series(ds) for ds in segs))) or ["(none)"]
        raise StudySkipped(f"study {key}: the SEG references series {', '.join(others)}, not the "
                           f"chosen CT series {ct_series_uid}")
    if len(matching) > 1:
        raise StudySkipped(f"study {key}: {len(matching)} SEGs reference the chosen CT series "
                           f"{ct_series_uid}; keep one in the PACS")
    try:
        seg = hd.seg.Segmentation.from_dataset(matching[0], copy=False)
        instances = read_source_instances(ct_folder)
    except (ValueError, AttributeError, TypeError, KeyError, DicomResultError) as exc:
        raise StudySkipped(f"study {key}: the SEG cannot be read ({type(exc).__name__}: "
                           f"{exc})") from None
    if str(seg.get("FrameOfReferenceUID", "")) != str(instances[0].get("FrameOfReferenceUID", "")):
        raise StudySkipped(f"study {key}: the SEG is in another frame of reference than the "
                           f"chosen CT series {ct_series_uid}")
    number = _segment_number(seg, segment, key)
    try:
        pixels = seg.get_pixels_by_source_instance(
            [str(ds.SOPInstanceUID) for ds in instances], segment_numbers=[number],
            assert_missing_frames_are_empty=True)[..., 0]
    except (ValueError, KeyError, RuntimeError) as exc:
        raise StudySkipped(f"study {key}: the SEG does not fit the chosen CT series "
                           f"({type(exc).__name__}: {exc})") from None
    binary = str(seg.SegmentationType) == "BINARY"
    return (pixels > 0 if binary else pixels >= 0.5).astype(np.uint8)
