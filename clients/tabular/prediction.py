"""The predictor of a table's rows (``make predict`` on a ``tabular-cls`` site folder).

A row's inputs depend on its table (the missing values and scales come from the
table's training split, :mod:`clients.tabular.scaling`), so the unit read is the
table: it is read once and each item, one row, takes its inputs by patient id.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from torch import nn

from clients.errors import StudyError
from clients.prediction.classifier import ClassifierPredictor
from clients.prediction.items import PredictionItem
from clients.training.trainer import ComputeDevice

__all__ = ["TableRowPredictor"]


class TableRowPredictor(ClassifierPredictor):
    """Sigmoid probabilities of one table row at a time (``predictions.csv``).

    Parameters
    ----------
    model : nn.Module
        The classifier, in eval mode.
    read_table : callable
        The table's path -> patient id -> the row's inputs (its usable rows only); the
        ``read`` of :class:`ClassifierPredictor`, here of a whole table.
    num_labels : int
        Labels of the task.
    compute : ComputeDevice
        Where to run.
    """

    #: A table row belongs to no DICOM study: no SR is written for it.
    dicom_results = False

    def __init__(self, model: nn.Module, read_table: Callable[[Path], dict[str, np.ndarray]],
                 num_labels: int, compute: ComputeDevice) -> None:
        super().__init__(model, read_table, num_labels, compute)  # type: ignore[arg-type]
        self._tables: dict[Path, dict[str, np.ndarray]] = {}

    def item_input(self, item: PredictionItem) -> np.ndarray:
        """The row's inputs, its table read once.

        Raises
        ------
        StudyError
            If the row was skipped when its table was read (a bad label or cell).
        """
        if item.image not in self._tables:
            self._tables[item.image] = self.read(item.image)  # type: ignore[assignment]
        inputs = self._tables[item.image].get(item.item_id)
        if inputs is None:
            raise StudyError(item.image, f"patient {item.item_id}: row not usable (see the site log)")
        return inputs
