"""Shared pieces of the image-classification tasks: tensors, balanced sampling, AUC, the task base.

Both classification tasks (2D chest X-ray, 3D CT volume) train on
``(image tensor, label vector)`` pairs with a sigmoid per label
(``BCEWithLogitsLoss``), sample the positive class at a set share, and report
ROC AUC (MONAI ``compute_roc_auc``, macro over labels) plus accuracy at 0.5;
:class:`ClassificationTask` holds what their site tasks share.
"""

from __future__ import annotations

from abc import abstractmethod
from functools import partial
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from clients.manifests.load_report import LoadReport
from clients.prediction.classifier import ClassifierPredictor, macro_auc
from clients.training.augmentation import augmented
from clients.training.site_task import EvalResult, SiteTask, TaskSettings, merged_report
from clients.training.trainer import ComputeDevice, positive_share_sampler

__all__ = ["LabelledTensors", "balanced_loader", "evaluate_classifier", "logit_metrics",
           "ClassificationTask"]


class LabelledTensors(Dataset):
    """Images (already decoded and normalised) with their label vectors, held in memory."""

    def __init__(self, images: list[np.ndarray], labels: list[np.ndarray]) -> None:
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} label vectors")
        self.images = [torch.from_numpy(np.ascontiguousarray(i, np.float32))[None]
                       for i in images]
        self.labels = [torch.from_numpy(np.asarray(l, np.float32)) for l in labels]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[i], self.labels[i]

    @property
    def positive_indices(self) -> list[int]:
        """Items with at least one positive label."""
        return [i for i, y in enumerate(self.labels) if bool(y.max() > 0)]


def balanced_loader(dataset: LabelledTensors, batch_size: int, positive_fraction: float,
                    seed: int, compute: ComputeDevice, augmentation: str = "none") -> DataLoader:
    """Sample with replacement so that ``positive_fraction`` of items are positive.

    The drawn images are augmented as run-config ``augmentation`` says
    (:func:`~clients.training.augmentation.augmented`; ``none``: as loaded). Batches are fed
    as ``compute`` asks (pinned memory, workers).
    """
    n = len(dataset)
    sampler = positive_share_sampler(n, dataset.positive_indices, positive_fraction, seed)
    return DataLoader(augmented(dataset, augmentation), batch_size=batch_size, sampler=sampler,
                      drop_last=n >= batch_size, **compute.loader_kwargs())


@torch.no_grad()
def evaluate_classifier(model: nn.Module, dataset: LabelledTensors, compute: ComputeDevice,
                        batch_size: int) -> EvalResult:
    """BCE loss, macro ROC AUC and accuracy at probability 0.5 over ``dataset``.

    ROC AUC (:func:`~clients.prediction.classifier.macro_auc`) is defined only
    when every label has both classes in ``dataset``; otherwise ``"auc"`` is
    left out of the metrics rather than sent as NaN, which the server would
    reject with the whole reply.
    """
    model.to(compute.device).eval()
    logits, targets = [], []
    for x, y in DataLoader(dataset, batch_size=batch_size, **compute.loader_kwargs(workers=False)):
        with compute.autocast():
            out = model(x.to(compute.device, non_blocking=True))
        logits.append(out.float())
        targets.append(y)
    return logit_metrics(torch.cat(logits).cpu(), torch.cat(targets))


def logit_metrics(logits: torch.Tensor, labels: torch.Tensor) -> EvalResult:
    """BCE loss per label, macro ROC AUC and accuracy at probability 0.5 of ``(N, L)`` logits.

    ROC AUC is left out where a label has one class only (see :func:`evaluate_classifier`).
    """
    loss = float(nn.BCEWithLogitsLoss(reduction="sum")(logits, labels))
    scores = torch.sigmoid(logits)
    metrics = {"accuracy": float(((scores > 0.5).float() == labels).float().mean())}
    auc = macro_auc(scores, labels)
    if auc is not None:  # else a label has one class only in ``dataset``: AUC is omitted
        metrics["auc"] = auc
    return EvalResult(num_examples=len(labels), loss=loss / max(labels.numel(), 1),
                      metrics=metrics, num_studies=len(labels))


class ClassificationTask(SiteTask):
    """A site's labelled images in memory, a sigmoid-per-label classifier, BCE loss and ROC AUC.

    ``__init__`` loads the ``train``, ``val`` and ``test`` splits with
    :meth:`_load_split` (the report merges them); a split without usable items
    is ``None``, and a site without a usable item in any split is a
    :class:`~clients.training.site_task.SiteDataError`. Training batches are
    class-balanced (:func:`balanced_loader`) and augmented as ``augmentation`` says;
    evaluation runs :func:`evaluate_classifier`; ``make predict`` scores one item at a time
    (:class:`~clients.prediction.classifier.ClassifierPredictor`). Subclasses set
    ``name``, ``manifest_name``, ``item_noun`` and the prediction attributes of
    :class:`~clients.training.site_task.SiteTask` and implement
    :meth:`_load_split`, :meth:`read_image`, :meth:`manifest_items`,
    :meth:`model_for` and :meth:`example_input`.
    """

    main_metric = "auc"
    #: What one item of the site is called in errors, e.g. ``"radiograph"``.
    item_noun: ClassVar[str]

    def __init__(self, site_dir: Path, settings: TaskSettings) -> None:
        super().__init__(site_dir, settings)
        loaded = {split: self._load_split(split) for split in ("train", "val", "test")}
        self.report = merged_report(*(report for _, report in loaded.values()))
        train, val, test = (data if len(data) else None for data, _ in loaded.values())
        self.train_set: LabelledTensors | None = train
        self.val_set: LabelledTensors | None = val
        self.test_set: LabelledTensors | None = test
        self._require_items(self.item_noun)

    @abstractmethod
    def _load_split(self, split: str) -> tuple[LabelledTensors, LoadReport]:
        """The usable items of one split, and the load report (bad items skipped)."""

    @classmethod
    @abstractmethod
    def read_image(cls, path: Path, settings: TaskSettings) -> np.ndarray:
        """One item's image read and preprocessed as :meth:`_load_split` does (``float32``, no
        channel axis).

        Raises
        ------
        ItemError
            If the file is unreadable.
        """

    @classmethod
    def predictor(cls, model: nn.Module, settings: TaskSettings, compute: ComputeDevice,
                  out: Path) -> ClassifierPredictor:
        """Probabilities per label of each item (``predictions.csv``; nothing else in ``out``)."""
        return ClassifierPredictor(model, partial(cls.read_image, settings=settings),
                                   settings.num_labels, compute)

    @staticmethod
    def loss_fn() -> nn.Module:
        """Binary cross-entropy per label, on logits."""
        return nn.BCEWithLogitsLoss()

    def _train_loader(self, seed: int, compute: ComputeDevice) -> DataLoader:
        return balanced_loader(self.require_training(), self.settings.batch_size,
                               self.settings.positive_fraction, seed, compute,
                               self.settings.augmentation)

    def _eval_batch_size(self) -> int:
        """Batch size of :meth:`evaluate`: the training batch size."""
        return self.settings.batch_size

    def _evaluate_on(self, model: nn.Module, data: LabelledTensors,
                     compute: ComputeDevice) -> EvalResult:
        """ROC AUC, accuracy and loss on one split's items."""
        return evaluate_classifier(model, data, compute, self._eval_batch_size())
