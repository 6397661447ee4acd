"""The tabular classification task of a site: one ``table.csv`` row per patient, a small MLP.

Rows from the site's ``table.csv`` (:mod:`clients.tabular.table`; a row with a
bad label or a cell that is not a number is skipped and counted), missing values
imputed with the training split's medians plus one missing indicator per
feature, standardised with the training split's means and sds
(:mod:`clients.tabular.scaling`), a two-hidden-layer MLP
(:func:`models.tabular_mlp.make_tabular_mlp`) with one sigmoid output, BCE loss,
ROC AUC: the tabular protocol of pvFed (Nishikawa et al., IEEJ 2024) and of
FLamby's Fed-Heart-Disease (du Terrail et al., NeurIPS 2022).

**Input width.** A row of ``F`` features is ``2F`` inputs (values and
indicators), so the width is a function of the header. The server builds the
network of a horizontal federation before it sees any data
(:meth:`TabularClsTask.model_for`, from the run config's sizes only): it is the
network of the standard columns, the 13 UCI Heart Disease variables
(:data:`~clients.tabular.heart_variables.HEART_FEATURES`, 26 inputs), which the
shared set ``heart-disease`` and the synthetic tabular hospitals write. A site
whose table has other columns (a department of a vertical federation,
:mod:`clients.tabular.departments`) trains its own network of its own width
(:meth:`TabularClsTask.build_model`), which never leaves it; in a horizontal
federation its model does not match the server's and its replies fail.
No run-config key carries the width.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch import nn

from clients.manifests.load_report import LoadReport, load_each
from clients.prediction.items import PredictionItem
from clients.tabular.heart_variables import HEART_FEATURES
from clients.tabular.prediction import TableRowPredictor
from clients.tabular.scaling import FeatureScaling, input_names
from clients.tabular.table import TABLE_NAME, Table, TableRow, parse_row, read_table
from clients.training.classification import ClassificationTask, LabelledTensors
from clients.training.trainer import ComputeDevice
from clients.training.site_task import TaskSettings
from models.tabular_mlp import make_tabular_mlp
from strategies.wire.errors import ConfigError, ItemError

__all__ = ["TabularClsTask", "table_inputs"]

#: A parsed row: (row, feature values with NaN, label).
_Parsed = tuple[TableRow, np.ndarray, float]


def _parse_all(table: Table) -> tuple[list[_Parsed], LoadReport]:
    """Every usable row of ``table`` in file order; bad rows skipped and counted."""
    return load_each(table.rows, lambda row: (row, *parse_row(row, table)),
                     lambda row: row.patient_id, noun="patient")


def _scaling_of(table: Table, parsed: list[_Parsed]) -> FeatureScaling:
    """The scaling fitted on the training rows only."""
    train = [values for row, values, _ in parsed if row.split == "train"]
    return FeatureScaling.fit(np.stack(train) if train else np.empty((0, len(table.features))))


def table_inputs(table: Table) -> dict[str, np.ndarray]:
    """Patient id -> standardised inputs ``(2F,)`` of every usable row of ``table`` (the scaling
    fitted on its training rows, as the task does)."""
    parsed, _ = _parse_all(table)
    scaling = _scaling_of(table, parsed)
    if not parsed:
        return {}
    inputs = scaling.transform(np.stack([values for _, values, _ in parsed]))
    return {row.patient_id: x for (row, _, _), x in zip(parsed, inputs)}


class TabularClsTask(ClassificationTask):
    """One site's table of patients and the MLP classifier.

    Attributes
    ----------
    features : tuple of str
        The table's feature columns, in order.
    scaling : FeatureScaling
        Medians, means and sds of the training split.
    """

    name = "tabular-cls"
    manifest_name = TABLE_NAME
    item_noun = "patient"
    preprocessing = ("one table.csv row: each missing feature replaced by the training split's "
                     "median, one 0/1 missing indicator per feature appended, all inputs "
                     "standardised with the training split's mean and sd; input (N, 2 x features); "
                     "output (N, {num_labels}) logits, sigmoid = probability")
    item_files = ()  # a row needs its table's training statistics: predict from a site folder

    def __init__(self, site_dir: Path, settings: TaskSettings) -> None:
        if settings.num_labels != 1:
            raise ConfigError(f"run config key 'num-labels' must be 1 for task {self.name!r} "
                              f"(table.csv has one 0/1 label column), got {settings.num_labels}")
        table = read_table(site_dir)
        parsed, report = _parse_all(table)
        self.features = table.features
        self.scaling = _scaling_of(table, parsed)
        split_of = {row.patient_id: row.split for row in table.rows}
        self._parsed, self._skipped = parsed, {k: (v, split_of[k]) for k, v in report.skipped.items()}
        super().__init__(site_dir, settings)  # calls _load_split for train, val and test
        del self._parsed, self._skipped

    @property
    def input_width(self) -> int:
        """Inputs of the network at this site: ``2 x len(features)``."""
        return len(input_names(self.features))

    def _load_split(self, split: str) -> tuple[LabelledTensors, LoadReport]:
        """The split's standardised rows (``(2F,)`` each) and 0/1 labels, in file order."""
        rows = [(row, values, label) for row, values, label in self._parsed if row.split == split]
        inputs = (self.scaling.transform(np.stack([v for _, v, _ in rows])) if rows
                  else np.empty((0, self.input_width), np.float32))
        report = LoadReport([row.patient_id for row, _, _ in rows],
                            {k: reason for k, (reason, s) in self._skipped.items() if s == split})
        return (LabelledTensors(list(inputs), [np.array([label], np.float32) for *_, label in rows]),
                report)

    def build_model(self, private: bool = False) -> nn.Module:
        """The MLP of this site's own columns: :meth:`model_for`'s network when they are the
        standard ones. No DP-SGD change is needed (no normalisation layer)."""
        if self.features == HEART_FEATURES:
            return self.model_for_run(self.settings, private)
        return make_tabular_mlp(self.input_width, self.settings.num_labels)

    @classmethod
    def model_for(cls, settings: TaskSettings) -> nn.Module:
        """The MLP of the standard columns (26 inputs; see the module docstring)."""
        return make_tabular_mlp(len(input_names(HEART_FEATURES)), settings.num_labels)

    @classmethod
    def example_input(cls, settings: TaskSettings) -> np.ndarray:
        """One row of the standard columns: (1, 26)."""
        return np.zeros((1, len(input_names(HEART_FEATURES))), dtype=np.float32)

    @classmethod
    def read_image(cls, path: Path, settings: TaskSettings) -> np.ndarray:
        """The inputs ``(rows, 2F)`` of every usable row of the table ``path`` (its site folder's
        ``table.csv``), in file order, preprocessed as in training (the unit read is the table:
        a row's inputs depend on its training split).

        Raises
        ------
        ManifestError
            If the table is unusable as a whole.
        """
        inputs = table_inputs(read_table(Path(path).parent))
        return np.stack(list(inputs.values())) if inputs else np.empty((0, 0), np.float32)

    @classmethod
    def manifest_items(cls, site_dir: Path, split: str | None,
                       settings: TaskSettings) -> list[PredictionItem]:
        """``table.csv`` rows; a row whose label does not parse is predicted without a reference."""
        table = read_table(site_dir)
        items = []
        for row in table.rows:
            if split is not None and row.split != split:
                continue
            labels = None
            try:
                labels = np.array([parse_row(row, table)[1]], np.float32)
            except ItemError:
                pass
            items.append(PredictionItem(row.patient_id, table.path, row.split, labels=labels))
        return items

    @classmethod
    def predictor(cls, model: nn.Module, settings: TaskSettings, compute: ComputeDevice,
                  out: Path) -> TableRowPredictor:
        """Probabilities of each row (``predictions.csv``), its table's statistics applied."""
        return TableRowPredictor(model, lambda path: table_inputs(read_table(path.parent)),
                                 settings.num_labels, compute)
