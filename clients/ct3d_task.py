"""The 3D CT volume classification task of a site (emphysema in the book chapter).

Volumes from the site's ``labels.csv`` (:mod:`clients.ct3d_manifest`; DICOM
series, NIfTI or pre-windowed .npy; bad items skipped and counted) resampled to
``volume-depth`` x ``image-size`` x ``image-size`` in a lung window, a ConvLSTM
classifier that scans the slices in alternating directions
(:class:`models.convlstm.ConvLSTMClassifier3D`; Shi et al., NeurIPS 2015), BCE
loss, ROC AUC.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch import nn
from torch.utils.data import DataLoader

from clients.classification import LabelledTensors, balanced_loader, evaluate_classifier
from clients.ct3d_manifest import load_ct3d_site
from clients.device import ComputeDevice
from clients.pe_studies import LoadReport
from clients.site_task import EvalResult, SiteDataError, SiteTask, TaskSettings
from models.convlstm import ConvLSTMClassifier3D

__all__ = ["CT3DClsTask"]

SMALL_WIDTHS = (8, 8, 16, 16)


class CT3DClsTask(SiteTask):
    """One site's labelled CT volumes and the ConvLSTM classifier."""

    name = "ct3d-cls"
    main_metric = "auc"

    def __init__(self, site_dir: Path, settings: TaskSettings) -> None:
        super().__init__(site_dir, settings)
        shape = (settings.volume_depth, settings.image_size, settings.image_size)
        train, train_report = load_ct3d_site(self.site_dir, "train", shape)
        val, val_report = load_ct3d_site(self.site_dir, "val", shape)
        self.report = LoadReport(loaded=train_report.loaded + val_report.loaded,
                                 skipped={**train_report.skipped, **val_report.skipped})
        if not train:
            raise SiteDataError(f"{self.site_dir}: no usable training volume "
                                f"({len(self.report.skipped)} skipped)")
        self.train_set = LabelledTensors([v for _, v, _ in train],
                                         [np.array([y], np.float32) for _, _, y in train])
        self.val_set = (LabelledTensors([v for _, v, _ in val],
                                        [np.array([y], np.float32) for _, _, y in val])
                        if val else None)

    @classmethod
    def model_for(cls, settings: TaskSettings) -> nn.Module:
        """The chapter's widths (32, 32, 64, 64) (``full``) or (8, 8, 16, 16) (``small``)."""
        if settings.model_size == "small":
            return ConvLSTMClassifier3D(widths=SMALL_WIDTHS)
        return ConvLSTMClassifier3D()

    @classmethod
    def example_input(cls, settings: TaskSettings) -> np.ndarray:
        """One volume: (1, 1, depth, image size, image size)."""
        size = settings.image_size
        return np.zeros((1, 1, settings.volume_depth, size, size), dtype=np.float32)

    @staticmethod
    def loss_fn() -> nn.Module:
        """Binary cross-entropy on the logit."""
        return nn.BCEWithLogitsLoss()

    def _train_loader(self, seed: int, compute: ComputeDevice) -> DataLoader:
        return balanced_loader(self.train_set, self.settings.batch_size,
                               self.settings.positive_fraction, seed, compute)

    def evaluate(self, model: nn.Module, compute: ComputeDevice) -> EvalResult:
        """ROC AUC, accuracy and loss on the site's validation volumes."""
        if self.val_set is None:
            raise SiteDataError(f"{self.site_dir}: no usable validation volume")
        return evaluate_classifier(model, self.val_set, compute, self.settings.batch_size)
