"""PneumoniaMNIST for the in-process benchmarks: the npz's splits and one standardisation.

The class-balanced PneumoniaMNIST subsample of ``../shared/data/cxr2d``
(MedMNIST v2, Yang et al., Sci Data 2023; Kermany et al., Cell 2018): 28 x 28
uint8 chest X-rays, label 1 = pneumonia, 0 = normal. The product's shared-set
converter (:func:`clients.datagen.shared.load_shared`) reads the same file
but merges train and val to write site folders; the benchmarks keep the
published splits (train for the sites, val for curves, test at the end) and
work on the arrays directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["DEFAULT_PATH", "DataMissingError", "PneumoniaMNIST", "load_pneumoniamnist",
           "pixel_stats", "standardise"]

#: Where the shared data folder keeps the file, next to the checkout.
DEFAULT_PATH = Path(__file__).resolve().parents[2] / "shared" / "data" / "cxr2d" / \
    "pneumoniamnist_balanced.npz"


class DataMissingError(FileNotFoundError):
    """The PneumoniaMNIST file is not where the benchmark expects it."""


@dataclass
class PneumoniaMNIST:
    """Images ``(N, 28, 28)`` uint8 and binary int64 labels ``(N,)`` per split (val optional)."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    val_images: np.ndarray | None = None
    val_labels: np.ndarray | None = None


def load_pneumoniamnist(path: Path = DEFAULT_PATH) -> PneumoniaMNIST:
    """The train, val and test splits of the npz.

    Raises
    ------
    DataMissingError
        If ``path`` is not a file (the message says where the data comes from).
    """
    if not Path(path).is_file():
        raise DataMissingError(
            f"PneumoniaMNIST not found at {path}; this benchmark needs the shared data "
            "folder (../shared/data/cxr2d/pneumoniamnist_balanced.npz, see "
            "../shared/data/README.md) or a path to the file")
    with np.load(path) as z:
        splits = {s: (z[f"{s}_images"], z[f"{s}_labels"].reshape(-1).astype(np.int64))
                  for s in ("train", "val", "test")}
    return PneumoniaMNIST(*splits["train"], *splits["test"], *splits["val"])


def pixel_stats(images: np.ndarray) -> tuple[float, float]:
    """Mean and standard deviation of the pixels scaled to [0, 1] (float64 accumulation)."""
    return float(images.mean()) / 255.0, float(images.std()) / 255.0


def standardise(images: np.ndarray, mean: float, std: float) -> np.ndarray:
    """``(images / 255 - mean) / std`` as float32 ``(N, 1, H, W)`` (one channel added)."""
    x = (images.astype(np.float32) / 255.0 - mean) / std
    return x[:, None]
