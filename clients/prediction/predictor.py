"""The predictor of a task: one item in, one row of the output table out (``make predict``).

A task's :meth:`~clients.training.site_task.SiteTask.predictor` hook builds one
for a model, its settings, the device and the output folder. ``make predict``
(:mod:`app.predict`) asks it for each item and writes the rows into the
predictor's table; everything task-specific (how an item is read and
preprocessed, what is written beside the table, which metric the references
give) is the predictor's. Two kinds exist:
:class:`~clients.prediction.classifier.ClassifierPredictor` (class
probabilities, ``predictions.csv``) and
:class:`~clients.pe_seg.prediction.SegmentationPredictor` (a NIfTI mask per
study on the series' grid, ``findings.csv``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from pydicom.dataset import Dataset

from clients.prediction.dicom_source import ModelIdentity
from clients.prediction.items import PredictionItem

__all__ = ["FINDINGS", "PREDICTIONS", "MASKS", "DICOM", "OUTPUTS", "DicomContent", "ItemResult",
           "Predictor"]

FINDINGS = "findings.csv"
PREDICTIONS = "predictions.csv"
MASKS = "masks"
#: The folder of the DICOM results (a SEG or an SR per item; docs/DEPLOYMENT-REFERENCE.md).
DICOM = "dicom"
#: Every file or folder a predictor may write into the output folder (the ones an
#: ``--overwrite`` run replaces); a predictor of a new kind adds its own here.
OUTPUTS = (FINDINGS, PREDICTIONS, MASKS, DICOM)


class DicomContent(Protocol):
    """What one item's DICOM result is made of: the prediction and its source.

    :class:`~clients.prediction.dicom_seg.SegmentationContent` (a DICOM-SEG, PS3.3 A.51)
    and :class:`~clients.prediction.dicom_sr.EvaluationContent` (a TID 1500 measurement
    report, PS3.16) are the two kinds.

    Attributes
    ----------
    kind : str
        ``SEG`` or ``SR``.
    suffix : str
        Its file's suffix (``.seg.dcm``, ``.sr.dcm``).
    """

    kind: str
    suffix: str

    def dataset(self, identity: ModelIdentity) -> Dataset:
        """The DICOM object, made by ``identity``'s model.

        Raises
        ------
        DicomResultError
            If the source is not DICOM or does not fit the prediction (names it).
        """
        ...


@dataclass(frozen=True)
class ItemResult:
    """What one item's prediction gives.

    Attributes
    ----------
    cells : list
        Its row's cells in the order of :attr:`Predictor.columns` (``None`` for an empty cell).
    note : str
        Its progress line's note, e.g. ``"p = 0.731"``.
    dicom : DicomContent | None
        What its DICOM result is made of (``make predict`` writes it into :data:`DICOM`);
        ``None`` when the task has no DICOM result.
    """

    cells: list[object]
    note: str
    dicom: DicomContent | None = field(default=None, compare=False, repr=False)


class Predictor(Protocol):
    """Predicts one item at a time and scores the items that have a reference.

    Attributes
    ----------
    table : str
        The output table's file name (one of :data:`OUTPUTS`).
    columns : tuple of str
        Its columns between ``id, split, image`` and ``seconds``.
    """

    table: str
    columns: tuple[str, ...]

    def predict(self, item: PredictionItem) -> ItemResult:
        """Predict ``item`` (writing what goes beside the table) and return its row.

        Raises
        ------
        ItemError
            If the item is unreadable; it is skipped and listed.
        """
        ...

    def metric(self) -> float | None:
        """The task's main metric over the items predicted so far that had a reference;
        ``None`` when there is none (or the metric is undefined on them)."""
        ...
