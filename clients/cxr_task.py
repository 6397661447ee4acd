"""The 2D chest X-ray classification task of a site (pneumothorax in the book chapter).

Radiographs from the site's ``images.csv`` (:mod:`clients.cxr_manifest`; PNG,
JPEG or DICOM, bad items skipped and counted) resized to ``image-size``, a
MONAI DenseNet121 (or its small CPU variant) with one sigmoid output per label
(Huang et al., CVPR 2017; Rajpurkar et al., CheXNet, 2017), BCE loss, ROC AUC.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch import nn
from torch.utils.data import DataLoader

from clients.classification import LabelledTensors, balanced_loader, evaluate_classifier
from clients.cxr_manifest import load_cxr_site
from clients.device import ComputeDevice
from clients.pe_studies import LoadReport
from clients.site_task import EvalResult, SiteDataError, SiteTask, TaskSettings
from models.cxr_densenet import make_cxr_densenet

__all__ = ["CXRClsTask"]


class CXRClsTask(SiteTask):
    """One site's radiographs and the DenseNet classifier."""

    name = "cxr-cls"
    main_metric = "auc"
    channels_last_ok = True

    def __init__(self, site_dir: Path, settings: TaskSettings) -> None:
        super().__init__(site_dir, settings)
        size, labels = settings.image_size, settings.num_labels
        train, train_report = load_cxr_site(self.site_dir, "train", size, labels)
        val, val_report = load_cxr_site(self.site_dir, "val", size, labels)
        self.report = LoadReport(loaded=train_report.loaded + val_report.loaded,
                                 skipped={**train_report.skipped, **val_report.skipped})
        if not train:
            raise SiteDataError(f"{self.site_dir}: no usable training radiograph "
                                f"({len(self.report.skipped)} skipped)")
        self.train_set = LabelledTensors([i.image for i in train], [i.labels for i in train])
        self.val_set = (LabelledTensors([i.image for i in val], [i.labels for i in val])
                        if val else None)

    @classmethod
    def model_for(cls, settings: TaskSettings) -> nn.Module:
        """DenseNet121 (``model-size = "full"``) or the small variant."""
        return make_cxr_densenet(num_labels=settings.num_labels,
                                 small=settings.model_size == "small")

    @classmethod
    def example_input(cls, settings: TaskSettings) -> np.ndarray:
        """One radiograph: (1, 1, image size, image size)."""
        return np.zeros((1, 1, settings.image_size, settings.image_size), dtype=np.float32)

    @staticmethod
    def loss_fn() -> nn.Module:
        """Binary cross-entropy per label, on logits."""
        return nn.BCEWithLogitsLoss()

    def _train_loader(self, seed: int, compute: ComputeDevice) -> DataLoader:
        return balanced_loader(self.train_set, self.settings.batch_size,
                               self.settings.positive_fraction, seed, compute)

    def evaluate(self, model: nn.Module, compute: ComputeDevice) -> EvalResult:
        """ROC AUC, accuracy and loss on the site's validation radiographs."""
        if self.val_set is None:
            raise SiteDataError(f"{self.site_dir}: no usable validation radiograph")
        return evaluate_classifier(model, self.val_set, compute,
                                   max(self.settings.batch_size, 16))
