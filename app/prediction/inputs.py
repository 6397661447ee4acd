"""What ``make predict`` runs over: a site folder's manifest, or a plain folder of studies / images.

A **site folder** holds the task's manifest (``manifest.csv`` for ``pe-seg``,
``images.csv`` for ``cxr-cls``, ``labels.csv`` for ``ct3d-cls``; docs/DATA.md):
its rows are the items, with their split and, where present, their reference
(the PE mask, the labels), so the task's metric can be computed. A **plain
folder** is what a PACS export gives: ``pe-seg`` takes every folder holding
files other than NIfTI / ``.npy`` volumes (masks) and notes as one DICOM
series; ``ct3d-cls`` the same, plus every NIfTI / ``.npy`` volume file;
``cxr-cls`` every PNG / JPEG / DICOM file. Folders are walked in
name order; an item's id is its path relative to the folder. Nothing is read
here beyond the manifest: an unreadable item is skipped later, when it is loaded.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from types import ModuleType

import numpy as np

from clients.errors import LabelError
from strategies.errors import ConfigError

__all__ = ["InputItem", "MANIFESTS", "discover_items"]

log = logging.getLogger(__name__)

#: Task -> (manifest module, manifest file name) of a site folder.
MANIFESTS = {"pe-seg": ("clients.pe_seg.manifest", "manifest.csv"),
             "cxr-cls": ("clients.cxr_cls.manifest", "images.csv"),
             "ct3d-cls": ("clients.ct3d_cls.manifest", "labels.csv")}
#: Files never taken for images in a plain folder (notes, tables, exports' side files).
_NOT_IMAGES = (".csv", ".txt", ".json", ".md", ".log", ".xml", ".html", ".pdf", ".zip")
_VOLUME_FILES = (".nii", ".nii.gz", ".npy")
_RADIOGRAPH_FILES = (".png", ".jpg", ".jpeg", ".dcm", ".dicom")


@dataclass(frozen=True)
class InputItem:
    """One study or image to predict.

    Attributes
    ----------
    item_id : str
        Its id: the manifest's id, or its path relative to a plain folder.
    image : Path
        The DICOM series folder or the image / volume file.
    split : str
        Its manifest split; empty in a plain folder.
    reference : Path | None
        ``pe-seg``: the site's NIfTI PE mask of the study (for Dice), if any.
    labels : np.ndarray | None
        Classification: the item's 0/1 labels, if the manifest has usable ones.
    """

    item_id: str
    image: Path
    split: str = ""
    reference: Path | None = None
    labels: np.ndarray | None = None


def discover_items(task: str, data: Path, split: str | None, num_labels: int = 1) -> list[InputItem]:
    """The items of ``data`` for ``task``: its manifest's rows (of ``split``), or a plain folder's files.

    Raises
    ------
    ConfigError
        If ``data`` is not a folder, holds another task's manifest, or ``split``
        is given for a plain folder or is not one of the manifest's splits.
    ManifestError
        If the site's manifest is malformed.
    """
    if not data.is_dir():
        raise ConfigError(f"DATA {data}: not a folder (a site folder or a folder of studies/images)")
    module, name = MANIFESTS[task]
    if (data / name).is_file():
        return _site_items(task, import_module(module), data, split, num_labels)
    for other, (_, other_name) in MANIFESTS.items():
        if other != task and (data / other_name).is_file():
            raise ConfigError(f"DATA {data}: holds {other_name}, a {other} site, but the model is "
                              f"for {task} (expects {name})")
    if split is not None:
        raise ConfigError(f"--split {split}: DATA {data} has no {name} (a plain folder has no splits)")
    return _series_items(data) if task == "pe-seg" else _file_items(task, data)


def _site_items(task: str, manifest: ModuleType, data: Path, split: str | None,
                num_labels: int) -> list[InputItem]:
    """The manifest rows of ``split`` (all when None) as items, with their references."""
    if split is not None and split not in manifest.SPLITS:
        raise ConfigError(f"--split {split}: {task} manifests have the splits {manifest.SPLITS}")
    rows = [row for row in manifest.read_manifest(data) if split is None or row.split == split]
    if task == "pe-seg":
        return [InputItem(r.study_id, r.image_dir, r.split, reference=r.mask_path) for r in rows]
    if task == "ct3d-cls":
        return [InputItem(r.study_id, r.image, r.split,
                          labels=None if r.label is None else np.array([r.label], np.float32))
                for r in rows]
    where = data.resolve() / MANIFESTS[task][1]
    items = []
    for r in rows:
        labels = None
        if r.labels.strip():
            try:
                labels = manifest.parse_labels(r.labels, num_labels, where,
                                               f"line {r.line} (image {r.image_id})")
            except LabelError as exc:
                log.warning("No reference labels for %s: %s", r.image_id, exc)
        items.append(InputItem(r.image_id, r.image_path, r.split, labels=labels))
    return items


def _walk(data: Path) -> Iterator[tuple[Path, list[str]]]:
    """``(folder, sorted visible files)`` of every folder under ``data``, in name order."""
    for root, dirs, files in os.walk(data):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        yield Path(root), sorted(f for f in files if not f.startswith("."))


def _item_id(data: Path, path: Path) -> str:
    """``path`` relative to ``data`` (POSIX), or ``data``'s own name for ``data`` itself."""
    relative = path.relative_to(data).as_posix()
    return data.name if relative == "." else relative


def _has_suffix(name: str, suffixes: tuple[str, ...]) -> bool:
    """True when the file name ends with one of ``suffixes`` (case-insensitive)."""
    return name.lower().endswith(suffixes)


def _series_items(data: Path) -> list[InputItem]:
    """Every folder holding files other than notes and NIfTI / .npy volumes (masks): one DICOM series each."""
    return [InputItem(_item_id(data, folder), folder) for folder, files in _walk(data)
            if any(not _has_suffix(f, _NOT_IMAGES + _VOLUME_FILES) for f in files)]


def _file_items(task: str, data: Path) -> list[InputItem]:
    """``cxr-cls``: every radiograph file; ``ct3d-cls``: every volume file and DICOM series folder."""
    items = []
    for folder, files in _walk(data):
        if task == "cxr-cls":
            items += [InputItem(_item_id(data, folder / f), folder / f) for f in files
                      if _has_suffix(f, _RADIOGRAPH_FILES)]
            continue
        volumes = [f for f in files if _has_suffix(f, _VOLUME_FILES)]
        items += [InputItem(_item_id(data, folder / f), folder / f) for f in volumes]
        if any(f not in volumes and not _has_suffix(f, _NOT_IMAGES) for f in files):
            items.append(InputItem(_item_id(data, folder), folder))
    return items
