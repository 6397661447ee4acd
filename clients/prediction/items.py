"""The items ``make predict`` runs over, and how a plain folder (a PACS export) is walked into them.

A task finds the items of a **site folder** in its manifest (with their split
and, where present, their reference: a mask, labels) through its
:meth:`~clients.training.site_task.SiteTask.manifest_items` hook, and those of a
**plain folder** through :meth:`~clients.training.site_task.SiteTask.folder_items`,
whose default is :func:`plain_folder_items` driven by two class attributes of
the task: the file suffixes that are one item each, and whether a folder of
other files is one item (a DICOM series). Folders are walked in name order,
hidden ones skipped; an item's id is its path relative to the folder. Nothing
is read here: an unreadable item is skipped later, when it is predicted.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["PredictionItem", "NOT_IMAGES", "VOLUME_FILES", "plain_folder_items", "output_name"]

#: Files never taken for images in a plain folder (notes, tables, exports' side files).
NOT_IMAGES = (".csv", ".txt", ".json", ".md", ".log", ".xml", ".html", ".pdf", ".zip")
#: Volume files (NIfTI, NumPy); in a folder of DICOM slices they are masks or derived data.
VOLUME_FILES = (".nii", ".nii.gz", ".npy")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class PredictionItem:
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
        A segmentation task's reference mask file of the item (for Dice), if any.
    labels : np.ndarray | None
        A classification task's 0/1 labels of the item, if the manifest has usable ones.
    """

    item_id: str
    image: Path
    split: str = ""
    reference: Path | None = None
    labels: np.ndarray | None = None


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


def plain_folder_items(data: Path, item_files: tuple[str, ...], series: bool) -> list[PredictionItem]:
    """Every item under ``data``: each file ending in ``item_files``, and with ``series`` each folder
    holding a file that is neither such a file, a note (:data:`NOT_IMAGES`) nor a volume
    (:data:`VOLUME_FILES`), taken for one DICOM series.

    Parameters
    ----------
    data : Path
        The plain folder.
    item_files : tuple of str
        Lower-case suffixes of the files that are one item each (``(".png", ".dcm")``).
    series : bool
        Whether a folder of other files is one item (a DICOM series, one file per slice).
    """
    items: list[PredictionItem] = []
    for folder, files in _walk(data):
        ours = [f for f in files if _has_suffix(f, item_files)]
        items += [PredictionItem(_item_id(data, folder / f), folder / f) for f in ours]
        others = NOT_IMAGES + VOLUME_FILES + item_files
        if series and any(not _has_suffix(f, others) for f in files):
            items.append(PredictionItem(_item_id(data, folder), folder))
    return items


def output_name(item_id: str, suffix: str, taken: set[str]) -> str:
    """A file name ``<id><suffix>`` for an item's output: unsafe characters replaced, unique in
    ``taken`` (``-2``, ``-3``... appended), and added to it."""
    stem = _UNSAFE.sub("_", item_id).strip("._") or "study"
    name, n = f"{stem}{suffix}", 1
    while name in taken:
        n += 1
        name = f"{stem}-{n}{suffix}"
    taken.add(name)
    return name
