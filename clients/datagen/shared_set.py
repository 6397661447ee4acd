"""What a task declares about one of its shared real data sets, and how its items reach the converter.

A task's ``shared`` module (e.g. :mod:`clients.pe_seg.shared`) declares each of
its sets as a :class:`SharedSet`: the source files under the shared folder,
what the set and its label are, the license, and the function that loads its
partitionable items (:class:`SiteItems`: one 0/1 label per item, their ids and
a writer of one site). The converter (:mod:`clients.datagen.shared`) does the
rest: partition, train/val/test split (:mod:`clients.datagen.held_out`), ``SOURCE.txt``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from strategies.wire.errors import ConfigError
from strategies.wire.registry import Registry

__all__ = ["SharedSet", "SiteItems", "set_registry", "own_hospitals", "MEDMNIST_LICENSE", "source_path", "read_medmnist", "medmnist_items"]

R = TypeVar("R")

#: License line of the MedMNIST v2 sets.
MEDMNIST_LICENSE = "License: CC BY 4.0 (MedMNIST v2). Real public data: do not commit it into the repository.\n"


@dataclass
class SiteItems:
    """The partitionable items of a set: a 0/1 label each, ids, an optional fixed val split, a writer.

    ``labels`` and ``ids`` cover every item; ``held_out`` (optional) lists the
    last items' indices, the source's own test split, which are never
    partitioned (:class:`clients.datagen.held_out.HeldOutPool`).
    ``write(site_dir, idx, splits)`` writes the items ``idx`` as one site, item
    ``idx[j]`` in split ``splits[j]`` (``train`` / ``val`` / ``test``); ``note``
    goes into ``SOURCE.txt``. ``hospitals`` (optional) is the hospital each item
    comes from, for a set of real hospitals: they are the sites
    (:func:`own_hospitals`), whatever the partition scheme.
    """

    labels: np.ndarray
    ids: list[str]
    write: Callable[[Path, np.ndarray, np.ndarray], None]
    fixed_val: np.ndarray | None = None
    note: str = ""
    held_out: np.ndarray | None = None
    #: The source's own hospital of each item (0, 1, ...): the sites are these hospitals.
    hospitals: np.ndarray | None = None

    @property
    def partitioned(self) -> np.ndarray:
        """Labels of the items to partition: all but the ``held_out`` ones (which come last)."""
        if self.held_out is None:
            return self.labels
        return self.labels[:self.labels.size - self.held_out.size]


@dataclass(frozen=True)
class SharedSet:
    """One shared data set and the task it feeds.

    Attributes
    ----------
    name : str
        Set name (``--set``).
    task : str
        The product task reading the written sites.
    files : tuple of str
        Source files relative to the shared folder.
    description : str
        What it is and what its label means (goes into every ``SOURCE.txt``).
    license : str
        License and citation line.
    load_items : callable
        ``load_items(source, shared, block_slices)`` -> :class:`SiteItems`.
    """

    name: str
    task: str
    files: tuple[str, ...]
    description: str
    license: str
    load_items: Callable[[SharedSet, Path, int], SiteItems]


def set_registry(*sets: SharedSet) -> Registry[SharedSet]:
    """One task's shared ``sets`` as a :class:`~strategies.wire.registry.Registry` by set name
    (``make ... SET=``, ``--set``): a task's ``shared`` module's ``SETS``."""
    registry: Registry[SharedSet] = Registry(f"shared set of task {sets[0].task!r}", "set")
    for shared in sets:
        registry.add(shared.name, shared)
    return registry


def own_hospitals(hospitals: np.ndarray, sites: int, name: str) -> list[np.ndarray]:
    """The items of each of a set's own hospitals, in hospital order (the sites of the set).

    Raises
    ------
    ConfigError
        If ``sites`` is not the number of hospitals (naming the set and ``--sites``).
    """
    count = int(np.max(hospitals)) + 1 if len(hospitals) else 0
    if sites != count:
        raise ConfigError(f"set {name!r} has its own {count} hospitals: --sites (SITES) must be "
                          f"{count}, got {sites} (the partition scheme does not apply)")
    return [np.flatnonzero(hospitals == k) for k in range(count)]


def source_path(shared: Path, relpath: str) -> Path:
    """``shared / relpath``, which must be a file.

    Raises
    ------
    FileNotFoundError
        If it is absent (the message names it and the README).
    """
    path = Path(shared) / relpath
    if not path.is_file():
        raise FileNotFoundError(
            f"shared data file not found: {path} (expected {relpath} under --shared {shared}; "
            "see ../shared/data/README.md)"
        )
    return path


def read_medmnist(path: Path, prefix: str, splits: tuple[str, ...] = ("train", "val")
                  ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The images, 0/1 labels and ids (``<prefix>-<split>-<i>``) of ``splits`` of a MedMNIST ``.npz``.

    Raises
    ------
    ValueError
        On a file without the expected keys, or labels outside {0, 1}.
    """
    images, labels, ids = [], [], []
    with np.load(path) as data:
        for split in splits:
            key_x, key_y = f"{split}_images", f"{split}_labels"
            if key_x not in data or key_y not in data:
                raise ValueError(f"{path}: missing {key_x} / {key_y}")
            x, y = data[key_x], np.asarray(data[key_y]).reshape(-1).astype(np.int64)
            if len(x) != len(y):
                raise ValueError(f"{path}: {key_x} has {len(x)} items but {key_y} has {len(y)}")
            images.append(x)
            labels.append(y)
            ids += [f"{prefix}-{split}-{i:05d}" for i in range(len(y))]
    labels_all = np.concatenate(labels)
    if not np.isin(labels_all, (0, 1)).all():
        raise ValueError(f"{path}: labels outside {{0, 1}}: {sorted(set(labels_all.tolist()))}")
    return np.concatenate(images), labels_all, ids


def medmnist_items(source: SharedSet, shared: Path, prefix: str, folder: str, suffix: str,
                   save: Callable[[Path, np.ndarray], None],
                   make_row: Callable[[str, str, Path, int], R],
                   write_manifest: Callable[[Path, list[R]], Path]) -> SiteItems:
    """The items of a MedMNIST classification set, each written as one file of a site.

    The train + val items are partitioned; the file's test split, when it has
    one, is the sites' held-out ``test`` pool (``SiteItems.held_out``). Item
    ``i`` of a site goes to ``<site>/<folder>/<id><suffix>`` via ``save(path,
    array)``; its manifest row is ``make_row(id, split, relative path, label)``
    and the site's rows are written by ``write_manifest``.
    """
    path = source_path(shared, source.files[0])
    with np.load(path) as data:
        has_test = "test_images" in data and "test_labels" in data
    images, labels, ids = read_medmnist(path, prefix, ("train", "val", "test") if has_test else ("train", "val"))
    held_out = np.flatnonzero([i.startswith(f"{prefix}-test-") for i in ids]) if has_test else None

    def write(site_dir: Path, idx: np.ndarray, splits: np.ndarray) -> None:
        (site_dir / folder).mkdir()
        rows = []
        for i, split in zip(idx, splits):
            rel = Path(f"{folder}/{ids[i]}{suffix}")
            save(site_dir / rel, images[i])
            rows.append(make_row(ids[i], str(split), rel, int(labels[i])))
        write_manifest(site_dir, rows)

    return SiteItems(labels, ids, write, held_out=held_out)
