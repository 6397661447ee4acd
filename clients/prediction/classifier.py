"""Class probabilities of one item at a time, and their macro ROC AUC (the classifiers' predictor).

Each item is read and preprocessed exactly as in training by the task's
``read`` function (a radiograph scaled to [0, 1] and squared, a CT volume in
a lung window on the task's grid...), given a batch and a channel axis, and
scored with one sigmoid per label. The row holds the probabilities, the
item's reference labels (empty cells without) and the predicted labels (1 when
the probability is at least 0.5, :func:`~clients.prediction.dicom_sr.predicted_label`);
the item's DICOM result is a TID 1500 measurement report of the same
(:class:`~clients.prediction.dicom_sr.EvaluationContent`). The metric is the
macro ROC AUC over the items with labels.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from clients.prediction.dicom_sr import EvaluationContent, predicted_label
from clients.prediction.items import PredictionItem
from clients.prediction.predictor import PREDICTIONS, ItemResult
from clients.training.trainer import ComputeDevice
from models.monai_core import compute_roc_auc

__all__ = ["macro_auc", "ClassifierPredictor"]


def macro_auc(scores: torch.Tensor, labels: torch.Tensor) -> float | None:
    """Macro ROC AUC over labels (Hanley & McNeil, Radiology 1982): the mean over labels of the
    probability that a positive scores above a negative.

    ``None`` when a label has one class only among the items (undefined there).

    Parameters
    ----------
    scores, labels : torch.Tensor
        ``(N, num labels)`` probabilities and 0/1 references.
    """
    if not all(0 < int(labels[:, j].sum()) < len(labels) for j in range(labels.shape[1])):
        return None
    return float(compute_roc_auc(scores, labels, average="macro"))


class ClassifierPredictor:
    """Sigmoid probabilities per label, one item at a time (``predictions.csv``).

    Parameters
    ----------
    model : nn.Module
        The classifier (logits ``(N, num labels)``), in eval mode.
    read : callable
        Path -> the item's image as the task's training data holds it (``float32``
        ``(H, W)`` or ``(D, H, W)``); raises an ``ItemError`` when unreadable.
    num_labels : int
        Labels of the task (one probability, one reference label and one predicted label
        column each).
    compute : ComputeDevice
        Where to run (autocast on CUDA).
    """

    table = PREDICTIONS
    #: Whether each item gets a DICOM SR (its source may be DICOM); a table row has no study.
    dicom_results = True

    def __init__(self, model: nn.Module, read: Callable[[Path], np.ndarray], num_labels: int,
                 compute: ComputeDevice) -> None:
        self.model, self.read, self.num_labels, self.compute = model, read, num_labels, compute
        suffixes = [""] if num_labels == 1 else [f"_{j}" for j in range(num_labels)]
        self.columns = (tuple(f"probability{s}" for s in suffixes) + tuple(f"label{s}" for s in suffixes)
                        + tuple(f"predicted{s}" for s in suffixes))
        self._scored: list[tuple[np.ndarray, np.ndarray]] = []

    @torch.no_grad()
    def _probabilities(self, image: np.ndarray) -> np.ndarray:
        """Sigmoid probabilities ``(num labels,)`` of one image (batch and channel axes added)."""
        batch = torch.from_numpy(np.ascontiguousarray(image, np.float32)[None, None])
        self.model.to(self.compute.device)
        with self.compute.autocast():
            logits = self.model(batch.to(self.compute.device))
        return torch.sigmoid(logits.float()).cpu().numpy()[0]

    def item_input(self, item: PredictionItem) -> np.ndarray:
        """The item's input as the training data holds it: ``read`` of its file."""
        return self.read(item.image)

    def predict(self, item: PredictionItem) -> ItemResult:
        """The item's probabilities and reference labels (a
        :class:`~clients.prediction.predictor.Predictor` row)."""
        scores = self._probabilities(self.item_input(item))
        if item.labels is None:
            labels: list[object] = [None] * self.num_labels
        else:
            labels = [int(v) for v in item.labels]
            self._scored.append((scores, item.labels))
        probabilities = tuple(float(s) for s in scores)
        return ItemResult([*probabilities, *labels, *(predicted_label(s) for s in probabilities)],
                          "p = " + ", ".join(f"{s:.3f}" for s in scores),
                          EvaluationContent(probabilities, item.image) if self.dicom_results else None)

    def metric(self) -> float | None:
        """Macro ROC AUC over the items with labels (:func:`macro_auc`)."""
        if not self._scored:
            return None
        scores = torch.tensor(np.stack([s for s, _ in self._scored]), dtype=torch.float32)
        labels = torch.tensor(np.stack([y for _, y in self._scored]), dtype=torch.float32)
        return macro_auc(scores, labels)
