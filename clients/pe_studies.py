"""Load a site's pulmonary-embolism (PE) studies: CT volume plus PE mask.

One bad study never stops a site: each :class:`~clients.errors.StudyError`
is caught, logged as one warning line and recorded in the :class:`LoadReport`.
A missing or malformed manifest (:class:`~clients.errors.ManifestError`) does
propagate, since then nothing at the site can be trusted.

The report holds study ids and file paths: it is for the site's own logs and
must not be sent to the server (send only counts).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from clients.dicom_series import read_dicom_series
from clients.errors import StudyError
from clients.manifest import SPLITS, StudyEntry, read_manifest
from clients.nifti_mask import read_nifti_mask

__all__ = ["Study", "LoadReport", "load_study", "load_site_studies"]

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Study:
    """One CT study held in memory.

    Attributes
    ----------
    study_id : str
        Site-unique study identifier.
    split : str
        ``"train"`` or ``"val"``.
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


@dataclass
class LoadReport:
    """What :func:`load_site_studies` loaded and skipped.

    Attributes
    ----------
    loaded : list of str
        Ids of the studies loaded, in manifest order.
    skipped : dict of str to str
        Study id -> reason (the :class:`StudyError` message, naming the file).
    """

    loaded: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def num_loaded(self) -> int:
        """Number of studies loaded."""
        return len(self.loaded)

    @property
    def num_skipped(self) -> int:
        """Number of studies skipped."""
        return len(self.skipped)


def load_study(entry: StudyEntry) -> Study:
    """Load one manifest entry.

    Parameters
    ----------
    entry : StudyEntry
        The manifest row.

    Returns
    -------
    Study
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
    return Study(entry.study_id, entry.split, volume.hu, mask, volume.spacing)


def load_site_studies(site_dir: Path, split: str | None = None) -> tuple[list[Study], LoadReport]:
    """Load every usable study of a site, skipping (and reporting) bad ones.

    Parameters
    ----------
    site_dir : Path
        The site folder holding ``manifest.csv``.
    split : str, optional
        ``"train"`` or ``"val"`` to load only that split; ``None`` loads all.

    Returns
    -------
    studies : list of Study
        The loaded studies, in manifest order.
    report : LoadReport
        Loaded ids and skipped ids with their reason.

    Raises
    ------
    ManifestError
        If the manifest is missing or malformed.
    ValueError
        If ``split`` is not ``None``, ``"train"`` or ``"val"``.
    """
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
    entries = [e for e in read_manifest(Path(site_dir)) if split is None or e.split == split]
    studies: list[Study] = []
    report = LoadReport()
    for entry in entries:
        try:
            study = load_study(entry)
        except StudyError as exc:
            report.skipped[entry.study_id] = str(exc)
            logger.warning("Skipping study %s: %s", entry.study_id, exc)
            continue
        studies.append(study)
        report.loaded.append(entry.study_id)
    return studies, report
