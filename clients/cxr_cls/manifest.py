"""The per-site manifest of chest X-ray classification (``images.csv``).

A site folder holds ``images.csv`` with the header ``image_id,split,image,labels``:
one row per radiograph; ``split`` is ``train``, ``val`` or ``test`` (held out, see
:data:`clients.manifests.csv_rows.SPLITS`); ``image``
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
outside {0, 1} or the wrong number of labels) only skip that item
(:func:`clients.cxr_cls.data.load_site`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clients.manifests.csv_rows import SPLITS, ManifestFormat
from clients.errors import LabelError

__all__ = [
    "MANIFEST_NAME",
    "MANIFEST_COLUMNS",
    "SPLITS",
    "LABEL_SEPARATOR",
    "LabelError",
    "ManifestRow",
    "read_manifest",
    "write_manifest",
    "parse_labels",
    "format_labels",
]

MANIFEST_NAME = "images.csv"
MANIFEST_COLUMNS = ("image_id", "split", "image", "labels")
LABEL_SEPARATOR = ";"
FORMAT = ManifestFormat(MANIFEST_NAME, MANIFEST_COLUMNS, ("image_id", "split", "image"), SPLITS, noun="image",
                        paths=("image",))


@dataclass(frozen=True)
class ManifestRow:
    """One ``images.csv`` row: the site-unique ``image_id`` (never leaves the site), its
    ``split`` (``train`` / ``val`` / ``test``), the absolute ``image_path`` of the
    radiograph, the raw ``labels`` field (checked by :func:`parse_labels` at load
    time) and the manifest ``line`` (1 = header) for error messages."""

    image_id: str
    split: str
    image_path: Path
    labels: str
    line: int = 0


def read_manifest(site_dir: Path) -> list[ManifestRow]:
    """The rows of ``site_dir / images.csv`` in file order, image paths made absolute.

    Neither the files nor the labels are checked here (see
    :func:`clients.cxr_cls.data.load_site`).

    Raises
    ------
    ManifestError
        If the manifest is missing or malformed (:class:`~clients.manifests.csv_rows.ManifestFormat`).
    """
    site_dir, rows = FORMAT.read(site_dir)
    return [ManifestRow(r["image_id"], r["split"], site_dir / r["image"], r["labels"], line)
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


def write_manifest(site_dir: Path, entries: Iterable[ManifestRow]) -> Path:
    """Write ``site_dir / images.csv`` (image paths relative to the site folder) and return its path.

    Labels are written as given (as made by :func:`format_labels`).

    Raises
    ------
    ValueError
        On an unknown split, an empty or duplicate image id.
    """
    return FORMAT.write(site_dir, entries, lambda entry, relative: [relative(entry.image_path), entry.labels])
