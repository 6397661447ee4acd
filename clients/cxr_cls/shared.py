"""The shared real set of chest X-ray classification, as federated sites (:mod:`clients.datagen.shared`).

``pneumoniamnist``: ``cxr2d/pneumoniamnist_balanced.npz`` (train + val) -> 28x28
8-bit PNGs under ``images/`` and ``images.csv`` (:mod:`clients.cxr_cls.manifest`).
The label is **pneumonia (1) vs normal (0)**, not pneumothorax.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from clients.cxr_cls.manifest import ManifestRow, format_labels, write_manifest
from clients.datagen.shared_set import (MEDMNIST_LICENSE, SharedSet, SiteItems,
                                        medmnist_items, set_registry)
from strategies.wire.registry import Registry

__all__ = ["PNEUMONIAMNIST", "SETS"]


def _save_png(path: Path, image: np.ndarray) -> None:
    from PIL import Image

    Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8), mode="L").save(path)


def _items(source: SharedSet, shared: Path, block_slices: int) -> SiteItems:
    return medmnist_items(
        source, shared, "pnm", "images", ".png", _save_png,
        lambda image_id, split, rel, label: ManifestRow(image_id, split, rel, format_labels([label])),
        write_manifest)


PNEUMONIAMNIST = SharedSet(
    "pneumoniamnist", "cxr-cls", ("cxr2d/pneumoniamnist_balanced.npz",),
    "PneumoniaMNIST (MedMNIST v2), 28x28 chest X-rays, class-balanced subsample.\n"
    "Label: 1 = PNEUMONIA, 0 = normal. This is NOT a pneumothorax label: a model\n"
    "trained here detects pneumonia and says nothing about pneumothorax.\n"
    "Cite: Yang et al., MedMNIST v2, Sci Data 2023; Kermany et al., Cell 2018.\n",
    MEDMNIST_LICENSE,
    _items,
)

#: The task's shared sets by name (listed, default first, in :data:`clients.registry.TASKS`).
SETS: Registry[SharedSet] = set_registry(PNEUMONIAMNIST)
