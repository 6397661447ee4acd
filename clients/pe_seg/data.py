"""Load a site's pulmonary-embolism (PE) studies: CT volume plus PE mask.

One bad study never stops a site: it is skipped and counted by
:func:`clients.manifests.load_report.load_each`. A missing or malformed
manifest (:class:`~clients.errors.ManifestError`) propagates, since then
nothing at the site can be trusted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clients.io.dicom_series import read_dicom_series
from clients.io.nifti import read_nifti_mask
from clients.manifests.load_report import LoadReport, load_each, rows_of_split
from clients.pe_seg.manifest import SPLITS, ManifestRow, read_manifest

__all__ = ["Item", "load_item", "load_site"]


@dataclass(eq=False)
class Item:
    """One CT study held in memory.

    Attributes
    ----------
    study_id : str
        Site-unique study identifier.
    split : str
        ``"train"``, ``"val"`` or ``"test"``.
    hu : np.ndarray
        ``float32`` ``(z, y, x)`` Hounsfield units, slices ascending.
    mask : np.ndarray
        ``uint8`` ``(z, y, x)`` PE labels (0 background, > 0 embolus), same shape.
    spacing : tuple of float
        ``(dz, dy, dx)`` in mm.
    """

    study_id: str
    split: str
    hu: np.ndarray
    mask: np.ndarray
    spacing: tuple[float, float, float]


def load_item(entry: ManifestRow) -> Item:
    """Load one manifest entry.

    Parameters
    ----------
    entry : ManifestRow
        The manifest row.

    Returns
    -------
    Item
        The study, its mask in the volume's voxel order.

    Raises
    ------
    DicomSeriesError
        If the DICOM series is unusable.
    MaskError
        If the mask is unreadable, misaligned or its shape differs from the volume.
    """
    volume = read_dicom_series(entry.image_dir)
    mask = read_nifti_mask(entry.mask_path, reference=volume)
    return Item(entry.study_id, entry.split, volume.hu, mask, volume.spacing)


def load_site(site_dir: Path, split: str | None = None) -> tuple[list[Item], LoadReport]:
    """Load every usable study of a site, skipping (and reporting) bad ones.

    Parameters
    ----------
    site_dir : Path
        The site folder holding ``manifest.csv``.
    split : str, optional
        ``"train"``, ``"val"`` or ``"test"`` to load only that split; ``None`` loads all.

    Returns
    -------
    studies : list of Item
        The loaded studies, in manifest order.
    report : LoadReport
        Loaded ids and skipped ids with their reason.

    Raises
    ------
    ManifestError
        If the manifest is missing or malformed.
    ValueError
        If ``split`` is not ``None`` or one of ``"train"``, ``"val"``, ``"test"``.
    """
    rows = rows_of_split(lambda: read_manifest(Path(site_dir)), split, SPLITS)
    return load_each(rows, load_item, lambda row: row.study_id)
