"""A classifier site reports only the metrics defined on its validation split (issue #12)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from clients.training.classification import LabelledTensors, evaluate_classifier
from clients.training.trainer import ComputeDevice

CPU = ComputeDevice(torch.device("cpu"), None)


class _Score(nn.Module):
    """Logit = the image's mean, so the scores rank the items."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1).mean(dim=1, keepdim=True)


def _split(labels: list[int]) -> LabelledTensors:
    images = [np.full((4, 4), float(i), np.float32) for i in range(len(labels))]
    return LabelledTensors(images, [np.asarray([y], np.float32) for y in labels])


def test_one_class_validation_split_omits_auc_instead_of_nan() -> None:
    result = evaluate_classifier(_Score(), _split([0, 0, 0]), CPU, batch_size=2)
    assert "auc" not in result.metrics
    assert all(math.isfinite(v) for v in result.metrics.values()) and math.isfinite(result.loss)
    assert set(result.metrics) == {"accuracy"} and result.num_examples == 3


def test_two_class_validation_split_reports_auc() -> None:
    result = evaluate_classifier(_Score(), _split([0, 1, 0, 1]), CPU, batch_size=2)
    assert result.metrics["auc"] == 0.75  # scores 0, 1, 2, 3: 3 of 4 positive-negative pairs ranked right
    assert set(result.metrics) == {"accuracy", "auc"}
