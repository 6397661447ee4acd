"""Load a site's labelled 3D CT volumes (``labels.csv``).

A row with a bad label, or whose image is missing, unreadable or of the wrong
dimensions, skips only that study: it is logged as one warning line and
counted in the :class:`~clients.manifests.load_report.LoadReport`, which holds
study ids and file paths and must not be sent to the server (send counts).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np

from clients.ct3d_cls.manifest import SPLITS, ManifestRow, read_manifest
from clients.errors import LabelError
from clients.io.volume import DEFAULT_SHAPE, LUNG_LEVEL, LUNG_WIDTH, load_ct_volume
from clients.manifests.load_report import LoadReport, load_each, rows_of_split

__all__ = ["Item", "load_site"]


class Item(NamedTuple):
    """One loaded study: ``(study_id, volume, label)``.

    Attributes
    ----------
    study_id : str
        Site-unique study identifier.
    volume : np.ndarray
        ``float32`` ``(D, H, W)`` in [0, 1] (:func:`clients.io.volume.load_ct_volume`).
    label : int
        0 or 1.
    """

    study_id: str
    volume: np.ndarray
    label: int


def load_site(
    site_dir: Path,
    split: str | None,
    shape: tuple[int, int, int] = DEFAULT_SHAPE,
    *,
    level: float = LUNG_LEVEL,
    width: float = LUNG_WIDTH,
) -> tuple[list[Item], LoadReport]:
    """Load every usable labelled volume of split ``split`` of a site, skipping (and reporting) bad rows.

    ``site_dir`` holds ``labels.csv``; ``split`` is ``"train"``, ``"val"``, ``"test"`` or
    ``None`` (all). Each volume goes through :func:`clients.io.volume.load_ct_volume`
    (lung window, fixed grid). A row with a bad label, or whose image is missing,
    unreadable or of the wrong dimensions (any :class:`~clients.errors.StudyError`), is
    skipped: recorded in the report and logged as one warning line
    ``Skipping study <id>: <file>: <reason>``.

    Parameters
    ----------
    shape : tuple of int, optional
        ``(D, H, W)`` grid. Default ``(32, 64, 64)``.
    level, width : float, optional
        HU window for DICOM / NIfTI images. Default lung window (-600, 1500).

    Returns
    -------
    volumes : list of Item
        ``(study_id, float32 (D, H, W) in [0, 1], label)`` in manifest order.
        May be empty if every row of the split was skipped (the task decides).
    report : LoadReport
        Loaded ids, and skipped ids with the reason (naming the file).

    Raises
    ------
    ManifestError
        If the manifest is missing, malformed or lists no study.
    ValueError
        If ``split`` is not ``None`` or one of ``"train"``, ``"val"``, ``"test"``, or ``shape`` is bad.
    """
    rows = rows_of_split(lambda: read_manifest(Path(site_dir)), split, SPLITS)

    def load(row: ManifestRow) -> Item:
        if row.error is not None or row.label is None:
            raise row.error or LabelError(row.image, "no label")
        return Item(row.study_id, load_ct_volume(row.image, shape, level=level, width=width), row.label)

    return load_each(rows, load, lambda row: row.study_id)
