"""A site's chest X-ray classification data: the ``images.csv`` manifest and its loader.

A site folder holds ``images.csv`` with the header ``image_id,split,image,labels``:
one row per radiograph; ``split`` is ``train``, ``val`` or ``test``; ``image``
is the PNG/JPEG/DICOM file relative to the site folder (POSIX separators);
``labels`` holds one 0/1 value per class of the task, ``;``-separated, in the
task's class order (``1`` for a binary task, ``0;1;0`` for three classes; the
task config says how many)::

    image_id,split,image,labels
    img-000,train,images/img-000.png,1
    img-001,val,images/img-001.dcm,0

The manifest is the site's table of contents: a missing file, a wrong header,
a row with the wrong number of fields, an empty id/split/image, an unknown
split or a duplicate id raise :class:`~clients.errors.ManifestError` and the
site is unusable. Problems of one item (its image unreadable, a label missing,
outside {0, 1} or the wrong number of labels) only skip that item: it is
logged as one warning line and counted in the
:class:`~clients.pe_studies.LoadReport`.

The report holds image ids and file paths: it is for the site's own logs and
must not be sent to the server (send only counts).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from clients.csv_manifest import read_manifest_rows, write_manifest_rows
from clients.cxr_image import read_radiograph
from clients.errors import LabelError, StudyError
from clients.pe_studies import LoadReport

__all__ = [
    "CXR_MANIFEST_NAME",
    "CXR_MANIFEST_COLUMNS",
    "CXR_SPLITS",
    "LABEL_SEPARATOR",
    "LabelError",
    "CXREntry",
    "CXRItem",
    "read_cxr_manifest",
    "write_cxr_manifest",
    "parse_labels",
    "format_labels",
    "load_cxr_site",
]

logger = logging.getLogger(__name__)

CXR_MANIFEST_NAME = "images.csv"
CXR_MANIFEST_COLUMNS = ("image_id", "split", "image", "labels")
CXR_SPLITS = ("train", "val", "test")
LABEL_SEPARATOR = ";"


@dataclass(frozen=True)
class CXREntry:
    """One ``images.csv`` row, the image path resolved against the site folder.

    Attributes
    ----------
    image_id : str
        Site-unique image identifier (never leaves the site).
    split : str
        ``"train"``, ``"val"`` or ``"test"``.
    image_path : Path
        Absolute path of the radiograph file.
    labels : str
        The raw ``labels`` field (validated by :func:`parse_labels` at load time).
    line : int
        Line number in the manifest (1 = header), for error messages.
    """

    image_id: str
    split: str
    image_path: Path
    labels: str
    line: int = 0


class CXRItem(NamedTuple):
    """One loaded radiograph: ``(image_id, image, labels)``.

    Attributes
    ----------
    image_id : str
        Site-unique image identifier.
    image : np.ndarray
        ``float32`` ``(size, size)`` in [0, 1] (:func:`clients.cxr_image.read_radiograph`).
    labels : np.ndarray
        ``float32`` ``(num_labels,)`` of 0/1, one per class (targets of a
        per-label sigmoid / ``BCEWithLogitsLoss``).
    """

    image_id: str
    image: np.ndarray
    labels: np.ndarray


def read_cxr_manifest(site_dir: Path) -> list[CXREntry]:
    """Read and validate the structure of ``site_dir / images.csv``.

    Parameters
    ----------
    site_dir : Path
        The site folder.

    Returns
    -------
    list of CXREntry
        The rows in file order, with absolute image paths. Neither the files
        nor the labels are checked here (see :func:`load_cxr_site`).

    Raises
    ------
    ManifestError
        If the manifest is missing, unreadable or empty, its header is not
        ``image_id,split,image,labels``, or a row has the wrong number of
        fields, an empty ``image_id``/``split``/``image``, an unknown split or a
        duplicate ``image_id`` (the message gives the line number).
    """
    site_dir = Path(site_dir).resolve()
    rows = read_manifest_rows(site_dir / CXR_MANIFEST_NAME, CXR_MANIFEST_COLUMNS,
                              ("image_id", "split", "image"), CXR_SPLITS)
    return [CXREntry(r["image_id"], r["split"], site_dir / r["image"], r["labels"], line)
            for line, r in rows]


def format_labels(values: Sequence[int]) -> str:
    """Format 0/1 labels as the manifest's ``labels`` field, e.g. ``(0, 1, 0) -> "0;1;0"``.

    Raises
    ------
    ValueError
        If ``values`` is empty or a value is not 0 or 1.
    """
    values = [int(v) for v in values]
    if not values or any(v not in (0, 1) for v in values):
        raise ValueError(f"labels must be a non-empty sequence of 0/1, got {values}")
    return LABEL_SEPARATOR.join(str(v) for v in values)


def parse_labels(text: str, num_labels: int, where: Path, context: str = "") -> np.ndarray:
    """Parse a ``labels`` field into a ``float32`` vector of 0/1.

    Parameters
    ----------
    text : str
        The field, e.g. ``"1"`` or ``"0;1;0"``. ``"1.0"`` is accepted as 1.
    num_labels : int
        Number of classes of the task.
    where : Path
        The manifest (named in the error).
    context : str, optional
        Prefix of the error reason, e.g. ``"line 7 (image img-005)"``.

    Returns
    -------
    np.ndarray
        ``float32`` ``(num_labels,)``.

    Raises
    ------
    LabelError
        If the field is empty, an element is empty or not a number, a value is
        not 0 or 1 (e.g. the ``-1`` "uncertain" of CheXpert), or the count is
        not ``num_labels``.
    """
    prefix = f"{context}: " if context else ""
    text = text.strip()
    if not text:
        raise LabelError(where, f"{prefix}missing labels; expected {num_labels} value(s) in {{0, 1}}")
    parts = [part.strip() for part in text.split(LABEL_SEPARATOR)]
    if len(parts) != num_labels:
        raise LabelError(
            where, f"{prefix}labels {text!r} has {len(parts)} value(s); the task has {num_labels} class(es)"
        )
    values = []
    for k, part in enumerate(parts):
        if not part:
            raise LabelError(where, f"{prefix}label {k} is missing in {text!r}")
        try:
            value = float(part)
        except ValueError:
            raise LabelError(where, f"{prefix}label {k} = {part!r} is not a number; expected 0 or 1") from None
        if value not in (0.0, 1.0):
            raise LabelError(where, f"{prefix}label {k} = {part!r} is outside the classes {{0, 1}}")
        values.append(value)
    return np.asarray(values, dtype=np.float32)


def write_cxr_manifest(site_dir: Path, entries: Iterable[CXREntry]) -> Path:
    """Write ``site_dir / images.csv`` (the folder is created) and return its path.

    Image paths, absolute or relative to ``site_dir``, are written relative to
    it (:func:`clients.csv_manifest.write_manifest_rows`); labels are written as
    given (as made by :func:`format_labels`).

    Raises
    ------
    ValueError
        On an unknown split, an empty or duplicate image id.
    """
    return write_manifest_rows(
        site_dir, CXR_MANIFEST_NAME, CXR_MANIFEST_COLUMNS, CXR_SPLITS, entries,
        lambda entry, relative: [relative(entry.image_path), entry.labels], noun="image",
    )


def load_cxr_site(
    site_dir: Path, split: str | None, size: int, num_labels: int
) -> tuple[list[CXRItem], LoadReport]:
    """Load every usable radiograph of a site, skipping (and reporting) bad items.

    Labels are checked before the image is decoded, so an item with bad labels
    costs no decoding time.

    Parameters
    ----------
    site_dir : Path
        The site folder holding ``images.csv``.
    split : str or None
        ``"train"``, ``"val"`` or ``"test"`` to load only that split; ``None`` loads all.
    size : int
        Output side of every image (:func:`clients.cxr_image.read_radiograph`).
    num_labels : int
        Number of classes of the task (labels per row).

    Returns
    -------
    items : list of CXRItem
        ``(image_id, image float32 (size, size), labels float32 (num_labels,))``
        tuples, in manifest order.
    report : LoadReport
        Loaded ids and skipped ids with their reason (the error message, naming
        the file and the line).

    Raises
    ------
    ManifestError
        If the manifest is missing or malformed.
    ValueError
        On an unknown ``split`` or ``num_labels < 1``.
    """
    if split is not None and split not in CXR_SPLITS:
        raise ValueError(f"split must be one of {CXR_SPLITS} or None, got {split!r}")
    if num_labels < 1:
        raise ValueError(f"num_labels must be >= 1, got {num_labels}")
    site_dir = Path(site_dir)
    entries = [e for e in read_cxr_manifest(site_dir) if split is None or e.split == split]
    manifest = site_dir.resolve() / CXR_MANIFEST_NAME
    items: list[CXRItem] = []
    report = LoadReport()
    for entry in entries:
        try:
            labels = parse_labels(entry.labels, num_labels, manifest, f"line {entry.line} (image {entry.image_id})")
            image = read_radiograph(entry.image_path, size)
        except StudyError as exc:
            report.skipped[entry.image_id] = str(exc)
            logger.warning("Skipping image %s: %s", entry.image_id, exc)
            continue
        items.append(CXRItem(entry.image_id, image, labels))
        report.loaded.append(entry.image_id)
    if not entries:
        logger.warning("No images in %s for split %s", manifest, split or "any")
    return items, report
