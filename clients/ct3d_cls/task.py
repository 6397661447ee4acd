"""The 3D CT volume classification task of a site (emphysema in the book chapter).

Volumes from the site's ``labels.csv`` (:mod:`clients.ct3d_cls.manifest`; DICOM
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

from clients.training.classification import ClassificationTask, LabelledTensors
from clients.ct3d_cls.data import load_site
from clients.ct3d_cls.manifest import MANIFEST_NAME, read_manifest
from clients.io.volume import load_ct_volume
from clients.manifests.load_report import LoadReport
from clients.prediction.items import VOLUME_FILES, PredictionItem
from clients.training.site_task import TaskSettings
from models.convlstm import ConvLSTMClassifier3D

__all__ = ["CT3DClsTask"]

SMALL_WIDTHS = (8, 8, 16, 16)


class CT3DClsTask(ClassificationTask):
    """One site's labelled CT volumes and the ConvLSTM classifier."""

    name = "ct3d-cls"
    manifest_name = MANIFEST_NAME
    item_noun = "volume"
    preprocessing = ("CT volume in HU, lung window level -600 HU / width 1500 HU to [0, 1] "
                     "(pre-windowed .npy as is), resampled to {volume_depth}x{image_size}x"
                     "{image_size}; input (N, 1, {volume_depth}, {image_size}, {image_size}); "
                     "output (N, {num_labels}) logits, sigmoid = probability")
    item_files = VOLUME_FILES
    item_series = True

    def _load_split(self, split: str) -> tuple[LabelledTensors, LoadReport]:
        """The split's volumes on the ``(volume depth, image size, image size)`` grid."""
        size = self.settings.image_size
        volumes, report = load_site(self.site_dir, split, (self.settings.volume_depth, size, size))
        return LabelledTensors([v for _, v, _ in volumes],
                               [np.array([y], np.float32) for _, _, y in volumes]), report

    @classmethod
    def read_image(cls, path: Path, settings: TaskSettings) -> np.ndarray:
        """The volume in the lung window on the task's grid
        (:func:`~clients.io.volume.load_ct_volume`)."""
        size = settings.image_size
        return load_ct_volume(path, (settings.volume_depth, size, size))

    @classmethod
    def manifest_items(cls, site_dir: Path, split: str | None,
                       settings: TaskSettings) -> list[PredictionItem]:
        """``labels.csv`` rows; a row without a usable label is predicted without a reference."""
        return [PredictionItem(r.study_id, r.image, r.split,
                               labels=None if r.label is None else np.array([r.label], np.float32))
                for r in read_manifest(site_dir) if split is None or r.split == split]

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
