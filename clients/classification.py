"""Shared pieces of the image-classification tasks: tensors, balanced sampling, AUC.

Both classification tasks (2D chest X-ray, 3D CT volume) train on
``(image tensor, label vector)`` pairs with a sigmoid per label
(``BCEWithLogitsLoss``), sample the positive class at a set share, and report
ROC AUC (MONAI ``compute_roc_auc``, macro over labels) plus accuracy at 0.5.
"""

from __future__ import annotations

import numpy as np
import torch
from monai.metrics import compute_roc_auc
from torch import nn
from torch.utils.data import DataLoader, Dataset

from clients.device import ComputeDevice
from clients.sampling import positive_share_sampler
from clients.site_task import EvalResult

__all__ = ["LabelledTensors", "balanced_loader", "evaluate_classifier"]


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
                    seed: int, compute: ComputeDevice) -> DataLoader:
    """Sample with replacement so that ``positive_fraction`` of items are positive.

    Batches are fed as ``compute`` asks (pinned memory, workers).
    """
    n = len(dataset)
    sampler = positive_share_sampler(n, dataset.positive_indices, positive_fraction, seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler,
                      drop_last=n >= batch_size, **compute.loader_kwargs())


@torch.no_grad()
def evaluate_classifier(model: nn.Module, dataset: LabelledTensors, compute: ComputeDevice,
                        batch_size: int) -> EvalResult:
    """BCE loss, macro ROC AUC and accuracy at probability 0.5 over ``dataset``."""
    model.to(compute.device).eval()
    loss_fn = nn.BCEWithLogitsLoss(reduction="sum")
    logits, targets = [], []
    for x, y in DataLoader(dataset, batch_size=batch_size, **compute.loader_kwargs(workers=False)):
        with compute.autocast():
            out = model(x.to(compute.device, non_blocking=True))
        logits.append(out.float())
        targets.append(y)
    out, labels = torch.cat(logits).cpu(), torch.cat(targets)
    loss = float(loss_fn(out, labels))
    scores = torch.sigmoid(out)
    metrics = {"accuracy": float(((scores > 0.5).float() == labels).float().mean())}
    if all(0 < int(labels[:, j].sum()) < len(labels) for j in range(labels.shape[1])):
        metrics["auc"] = float(compute_roc_auc(scores, labels, average="macro"))
    else:
        metrics["auc"] = float("nan")  # one class only: AUC undefined at this site
    return EvalResult(num_examples=len(dataset), loss=loss / max(labels.numel(), 1),
                      metrics=metrics, num_studies=len(dataset))
