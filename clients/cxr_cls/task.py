"""The 2D chest X-ray classification task of a site (pneumothorax in the book chapter).

Radiographs from the site's ``images.csv`` (:mod:`clients.cxr_cls.manifest`; PNG,
JPEG or DICOM, bad items skipped and counted) resized to ``image-size``, a
MONAI DenseNet121 (or its small CPU variant) with one sigmoid output per label
(Huang et al., CVPR 2017; Rajpurkar et al., CheXNet, 2017), BCE loss, ROC AUC.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from torch import nn

from clients.errors import LabelError
from clients.training.classification import ClassificationTask, LabelledTensors
from clients.cxr_cls.data import load_site
from clients.cxr_cls.manifest import MANIFEST_NAME, parse_labels, read_manifest
from clients.io.radiograph import read_radiograph
from clients.manifests.load_report import LoadReport
from clients.prediction.items import PredictionItem
from clients.training.site_task import TaskSettings
from models.cxr_densenet import make_cxr_densenet

__all__ = ["CXRClsTask"]

log = logging.getLogger(__name__)


class CXRClsTask(ClassificationTask):
    """One site's radiographs and the DenseNet classifier."""

    name = "cxr-cls"
    manifest_name = MANIFEST_NAME
    item_noun = "radiograph"
    channels_last_ok = True
    preprocessing = ("radiograph (DICOM Modality and VOI LUT, MONOCHROME1 inverted; PNG/JPEG as "
                     "luma), per-image min-max scaled to [0, 1], longer side resized to "
                     "{image_size} and centred on a zero-padded square; input (N, 1, {image_size}, "
                     "{image_size}); output (N, {num_labels}) logits, sigmoid = probability")
    item_files = (".png", ".jpg", ".jpeg", ".dcm", ".dicom")

    def _load_split(self, split: str) -> tuple[LabelledTensors, LoadReport]:
        """The split's radiographs at ``image size``, with ``num labels`` labels each."""
        items, report = load_site(self.site_dir, split, self.settings.image_size,
                                      self.settings.num_labels)
        return LabelledTensors([i.image for i in items], [i.labels for i in items]), report

    @classmethod
    def read_image(cls, path: Path, settings: TaskSettings) -> np.ndarray:
        """The radiograph in [0, 1], squared to ``image size``
        (:func:`~clients.io.radiograph.read_radiograph`)."""
        return read_radiograph(path, settings.image_size)

    @classmethod
    def manifest_items(cls, site_dir: Path, split: str | None,
                       settings: TaskSettings) -> list[PredictionItem]:
        """``images.csv`` rows; a row whose labels do not parse is predicted without a reference."""
        where = Path(site_dir).resolve() / MANIFEST_NAME
        items = []
        for row in read_manifest(site_dir):
            if split is not None and row.split != split:
                continue
            labels = None
            if row.labels.strip():
                try:
                    labels = parse_labels(row.labels, settings.num_labels, where,
                                          f"line {row.line} (image {row.image_id})")
                except LabelError as exc:
                    log.warning("No reference labels for %s: %s", row.image_id, exc)
            items.append(PredictionItem(row.image_id, row.image_path, row.split, labels=labels))
        return items

    @classmethod
    def model_for(cls, settings: TaskSettings) -> nn.Module:
        """DenseNet121 (``model-size = "full"``) or the small variant."""
        return make_cxr_densenet(num_labels=settings.num_labels,
                                 small=settings.model_size == "small")

    @classmethod
    def example_input(cls, settings: TaskSettings) -> np.ndarray:
        """One radiograph: (1, 1, image size, image size)."""
        return np.zeros((1, 1, settings.image_size, settings.image_size), dtype=np.float32)

    def _eval_batch_size(self) -> int:
        """At least 16 radiographs per evaluation batch."""
        return max(self.settings.batch_size, 16)
