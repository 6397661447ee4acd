"""Load a site's chest radiographs and their labels (``images.csv``).

One unreadable image or bad label row skips only that item: it is logged as
one warning line and counted in the
:class:`~clients.manifests.load_report.LoadReport`, which holds image ids and
file paths and must not be sent to the server (send only counts).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import numpy as np

from clients.cxr_cls.manifest import MANIFEST_NAME, SPLITS, ManifestRow, parse_labels, read_manifest
from clients.io.radiograph import read_radiograph
from clients.manifests.load_report import LoadReport, load_each, rows_of_split

__all__ = ["Item", "load_site"]

logger = logging.getLogger(__name__)


class Item(NamedTuple):
    """One loaded radiograph: ``(image_id, image, labels)``.

    Attributes
    ----------
    image_id : str
        Site-unique image identifier.
    image : np.ndarray
        ``float32`` ``(size, size)`` in [0, 1] (:func:`clients.io.radiograph.read_radiograph`).
    labels : np.ndarray
        ``float32`` ``(num_labels,)`` of 0/1, one per class (targets of a
        per-label sigmoid / ``BCEWithLogitsLoss``).
    """

    image_id: str
    image: np.ndarray
    labels: np.ndarray


def load_site(
    site_dir: Path, split: str | None, size: int, num_labels: int
) -> tuple[list[Item], LoadReport]:
    """Load every usable radiograph of split ``split`` of a site, skipping (and reporting) bad items.

    ``site_dir`` holds ``images.csv``; ``split`` is ``"train"``, ``"val"``, ``"test"`` or
    ``None`` (all). Labels are checked before the image is decoded, so an item with bad
    labels costs no decoding time.

    Parameters
    ----------
    size : int
        Output side of every image (:func:`clients.io.radiograph.read_radiograph`).
    num_labels : int
        Number of classes of the task (labels per row).

    Returns
    -------
    items : list of Item
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
    if num_labels < 1:
        raise ValueError(f"num_labels must be >= 1, got {num_labels}")
    site_dir = Path(site_dir)
    rows = rows_of_split(lambda: read_manifest(site_dir), split, SPLITS)
    manifest = site_dir.resolve() / MANIFEST_NAME

    def load(row: ManifestRow) -> Item:
        # Labels are checked before the image is decoded: a bad row costs no decoding time.
        labels = parse_labels(row.labels, num_labels, manifest, f"line {row.line} (image {row.image_id})")
        return Item(row.image_id, read_radiograph(row.image_path, size), labels)

    items, report = load_each(rows, load, lambda row: row.image_id, noun="image")
    if not rows:  # a site without val or test items is usable: only missing training data warns
        (logger.warning if split in (None, "train") else logger.info)(
            "No images in %s for split %s", manifest, split or "any")
    return items, report
