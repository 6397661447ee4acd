"""The 3D CT volume classification task of a site (emphysema in the book chapter).

Volumes from the site's ``labels.csv`` (:mod:`clients.ct3d_cls.manifest`; DICOM
series, NIfTI or pre-windowed .npy; bad items skipped and counted) resampled to
``volume-depth`` x ``image-size`` x ``image-size`` in a lung window, a ConvLSTM
classifier that scans the slices in alternating directions
(:class:`models.convlstm.ConvLSTMClassifier3D`; Shi et al., NeurIPS 2015), BCE
loss, ROC AUC.
"""

from __future__ import annotations

import numpy as np
from torch import nn

from clients.training.classification import ClassificationTask, LabelledTensors
from clients.ct3d_cls.data import load_site
from clients.ct3d_cls.manifest import MANIFEST_NAME
from clients.manifests.load_report import LoadReport
from clients.training.site_task import TaskSettings
from models.convlstm import ConvLSTMClassifier3D

__all__ = ["CT3DClsTask"]

SMALL_WIDTHS = (8, 8, 16, 16)


class CT3DClsTask(ClassificationTask):
    """One site's labelled CT volumes and the ConvLSTM classifier."""

    name = "ct3d-cls"
    manifest_name = MANIFEST_NAME
    item_noun = "volume"

    def _load_split(self, split: str) -> tuple[LabelledTensors, LoadReport]:
        """The split's volumes on the ``(volume depth, image size, image size)`` grid."""
        size = self.settings.image_size
        volumes, report = load_site(self.site_dir, split, (self.settings.volume_depth, size, size))
        return LabelledTensors([v for _, v, _ in volumes],
                               [np.array([y], np.float32) for _, _, y in volumes]), report

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
