"""The 2D chest X-ray classification task of a site (pneumothorax in the book chapter).

Radiographs from the site's ``images.csv`` (:mod:`clients.cxr_cls.manifest`; PNG,
JPEG or DICOM, bad items skipped and counted) resized to ``image-size``, a
MONAI DenseNet121 (or its small CPU variant) with one sigmoid output per label
(Huang et al., CVPR 2017; Rajpurkar et al., CheXNet, 2017), BCE loss, ROC AUC.
"""

from __future__ import annotations

import numpy as np
from torch import nn

from clients.training.classification import ClassificationTask, LabelledTensors
from clients.cxr_cls.data import load_site
from clients.cxr_cls.manifest import MANIFEST_NAME
from clients.manifests.load_report import LoadReport
from clients.training.site_task import TaskSettings
from models.cxr_densenet import make_cxr_densenet

__all__ = ["CXRClsTask"]


class CXRClsTask(ClassificationTask):
    """One site's radiographs and the DenseNet classifier."""

    name = "cxr-cls"
    manifest_name = MANIFEST_NAME
    item_noun = "radiograph"
    channels_last_ok = True

    def _load_split(self, split: str) -> tuple[LabelledTensors, LoadReport]:
        """The split's radiographs at ``image size``, with ``num labels`` labels each."""
        items, report = load_site(self.site_dir, split, self.settings.image_size,
                                      self.settings.num_labels)
        return LabelledTensors([i.image for i in items], [i.labels for i in items]), report

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
