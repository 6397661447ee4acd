"""The shared real set of 3D CT classification, as federated sites (:mod:`clients.datagen.shared`).

``adrenalmnist3d``: ``ct3d/adrenalmnist3d_64.npz`` (train + val) -> one uint8
``(z, y, x)`` ``.npy`` per study under ``volumes/`` and ``labels.csv``
(:mod:`clients.ct3d_cls.manifest`). The label is the AdrenalMNIST3D label
(adrenal mass shape), **not** emphysema.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from clients.ct3d_cls.manifest import ManifestRow, write_manifest
from clients.datagen.shared_set import (MEDMNIST_LICENSE, SharedSet, SiteItems,
                                        medmnist_items, set_registry)
from strategies.wire.registry import Registry

__all__ = ["ADRENALMNIST3D", "SETS"]


def _save_npy(path: Path, volume: np.ndarray) -> None:
    np.save(path, np.ascontiguousarray(volume, dtype=np.uint8))


def _items(source: SharedSet, shared: Path, block_slices: int) -> SiteItems:
    return medmnist_items(source, shared, "adr", "volumes", ".npy", _save_npy, ManifestRow, write_manifest)


ADRENALMNIST3D = SharedSet(
    "adrenalmnist3d", "ct3d-cls", ("ct3d/adrenalmnist3d_64.npz",),
    "AdrenalMNIST3D (MedMNIST v2) at 64^3: uint8 {0,255} shape masks from abdominal CT,\n"
    "saved as (z, y, x) uint8 .npy volumes.\n"
    "Label: the AdrenalMNIST3D binary label (adrenal mass shape class), 1 / 0.\n"
    "This is NOT an emphysema label, and the volumes are masks, not lung CT intensities.\n"
    "Cite: Yang et al., MedMNIST v2, Sci Data 2023.\n",
    MEDMNIST_LICENSE,
    _items,
)

#: The task's shared sets by name (listed, default first, in :data:`clients.registry.TASKS`).
SETS: Registry[SharedSet] = set_registry(ADRENALMNIST3D)
