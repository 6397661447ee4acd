"""Class probabilities of one radiograph or CT volume, read as in training.

``cxr-cls``: :func:`clients.io.radiograph.read_radiograph` (display values
scaled to [0, 1], squared to the model's ``image size``); ``ct3d-cls``:
:func:`clients.io.volume.load_ct_volume` (lung window, ``volume depth`` x
``image size`` x ``image size`` grid). One sigmoid per label.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from clients.io.radiograph import read_radiograph
from clients.io.volume import load_ct_volume
from clients.training.device import ComputeDevice
from clients.training.site_task import TaskSettings

__all__ = ["read_input", "classify"]


def read_input(task: str, path: Path, settings: TaskSettings) -> np.ndarray:
    """The model input of one item, ``float32`` ``(1, 1, H, W)`` or ``(1, 1, D, H, W)``.

    Raises
    ------
    ItemError
        If the file is unreadable (:class:`~clients.errors.RadiographError`,
        :class:`~clients.errors.VolumeError`, :class:`~clients.errors.DicomSeriesError`).
    """
    size = settings.image_size
    if task == "cxr-cls":
        image = read_radiograph(path, size)
    else:
        image = load_ct_volume(path, (settings.volume_depth, size, size))
    return np.ascontiguousarray(image, np.float32)[None, None]


@torch.no_grad()
def classify(model: nn.Module, batch: np.ndarray, compute: ComputeDevice) -> np.ndarray:
    """Sigmoid probabilities ``(N, num labels)`` of a batch of inputs."""
    model.to(compute.device)
    with compute.autocast():
        logits = model(torch.from_numpy(batch).to(compute.device))
    return torch.sigmoid(logits.float()).cpu().numpy()
