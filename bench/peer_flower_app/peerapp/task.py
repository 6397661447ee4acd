"""peerapp: the model, the site data and the train/test loops, as Flower's quickstart writes them.

The model is the product's cxr-cls network (``models.cxr_densenet``, the small
DenseNet; Huang et al., CVPR 2017): the only import from the product. The data
are a site folder's ``images.csv`` rows and PNGs, read here with Pillow the way
the product reads a PNG radiograph (min-max to [0, 1], bilinear resize to
``image-size``), so both apps see identical items.
"""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from models.cxr_densenet import make_cxr_densenet

_SPLITS: dict[tuple[str, str, int], TensorDataset] = {}  # cached per worker, like the quickstart's fds


def Net() -> nn.Module:  # noqa: N802 - the name Flower's examples use
    """The product's cxr-cls model at model-size small: one logit (pneumonia)."""
    return make_cxr_densenet(num_labels=1, small=True)


def _image(path: Path, size: int) -> np.ndarray:
    """A grey PNG as ``float32`` ``(size, size)`` in [0, 1]: min-max scaled, then resized."""
    with Image.open(path) as image:
        pixels = np.asarray(image.convert("L"), dtype=np.float64)
    low, high = pixels.min(), pixels.max()
    scaled = ((pixels - low) / max(high - low, 1e-12)).astype(np.float32)
    if scaled.shape != (size, size):
        scaled = np.asarray(Image.fromarray(scaled).resize((size, size), Image.Resampling.BILINEAR),
                            dtype=np.float32)
    return np.clip(scaled, 0.0, 1.0)


def load_split(site_dir: Path, split: str, image_size: int) -> TensorDataset:
    """The rows of ``split`` in ``site_dir/images.csv`` as ``(N, 1, H, W)`` images and ``(N, 1)`` labels."""
    key = (str(site_dir), split, image_size)
    if key not in _SPLITS:
        with open(Path(site_dir) / "images.csv", newline="", encoding="utf-8") as handle:
            rows = [r for r in csv.DictReader(handle) if r["split"] == split]
        images = np.stack([_image(Path(site_dir) / r["image"], image_size) for r in rows])
        labels = np.array([[float(r["labels"])] for r in rows], dtype=np.float32)
        _SPLITS[key] = TensorDataset(torch.from_numpy(images)[:, None], torch.from_numpy(labels))
    return _SPLITS[key]


def load_data(site_dir: Path, image_size: int, batch_size: int) -> tuple[DataLoader, DataLoader]:
    """The site's train loader (shuffled) and validation loader."""
    train = load_split(site_dir, "train", image_size)
    val = load_split(site_dir, "val", image_size)
    return (DataLoader(train, batch_size=batch_size, shuffle=True),
            DataLoader(val, batch_size=batch_size))


def train(net: nn.Module, trainloader: DataLoader, steps: int, lr: float, momentum: float,
          device: torch.device) -> float:
    """``steps`` Adam steps (beta1 = ``momentum``) of BCE on logits; the mean training loss."""
    net.to(device).train()
    criterion = nn.BCEWithLogitsLoss()
    optimizer = torch.optim.Adam(net.parameters(), lr=lr, betas=(momentum, 0.999))
    batches = itertools.chain.from_iterable(itertools.repeat(trainloader))
    running = 0.0
    for images, labels in itertools.islice(batches, steps):
        optimizer.zero_grad()
        loss = criterion(net(images.to(device)), labels.to(device))
        loss.backward()
        optimizer.step()
        running += loss.item()
    return running / steps


@torch.no_grad()
def test(net: nn.Module, testloader: DataLoader, device: torch.device) -> tuple[float, float]:
    """Mean BCE loss and accuracy at probability 0.5."""
    net.to(device).eval()
    criterion = nn.BCEWithLogitsLoss(reduction="sum")
    loss, correct, count = 0.0, 0, 0
    for images, labels in testloader:
        logits = net(images.to(device))
        loss += criterion(logits, labels.to(device)).item()
        correct += int(((logits > 0).float() == labels.to(device)).sum())
        count += len(labels)
    return loss / max(count, 1), correct / max(count, 1)
