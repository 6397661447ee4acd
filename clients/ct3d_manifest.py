"""The per-site label manifest of 3D CT classification (``labels.csv``) and its loader.

A site folder holds ``labels.csv`` with the header ``study_id,split,image,label``:
one row per study; ``split`` is ``train`` or ``val``; ``image`` is a DICOM
series folder, a ``.nii`` / ``.nii.gz`` HU file or a pre-windowed ``.npy``
volume, relative to the site folder (POSIX separators); ``label`` is the
volume-level class, ``0`` (negative) or ``1`` (positive, e.g. emphysema).

Two levels of failure, as for the PE manifest (:mod:`clients.manifest`):

* the table itself - missing file, wrong header, wrong field count, empty
  study id or image, unknown split, duplicate study id, no study at all -
  raises :class:`~clients.errors.ManifestError` (nothing at the site can be
  trusted);
* one row's **label** - missing, or not a class in {0, 1} - is a
  :class:`LabelError` (a :class:`~clients.errors.StudyError`) carried by that
  row's :class:`LabelEntry`; :func:`load_ct3d_site` skips the row, counts it
  and logs one line, like a study whose image is unreadable.

The :class:`~clients.pe_studies.LoadReport` holds study ids and file paths: it
is for the site's own logs and must not be sent to the server (send counts).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clients.ct_volume import DEFAULT_SHAPE, LUNG_LEVEL, LUNG_WIDTH, load_ct_volume
from clients.csv_manifest import RelativePath, read_manifest_rows, write_manifest_rows
from clients.errors import LabelError, ManifestError, StudyError
from clients.manifest import SPLITS
from clients.pe_studies import LoadReport

__all__ = [
    "LABELS_NAME",
    "LABEL_COLUMNS",
    "CLASSES",
    "LabelError",
    "LabelEntry",
    "LabelledVolume",
    "read_label_manifest",
    "write_label_manifest",
    "load_ct3d_site",
]

logger = logging.getLogger(__name__)

LABELS_NAME = "labels.csv"
LABEL_COLUMNS = ("study_id", "split", "image", "label")
CLASSES = (0, 1)

#: One loaded study: (study_id, float32 (D, H, W) volume in [0, 1], label 0/1).
LabelledVolume = tuple[str, np.ndarray, int]


@dataclass(frozen=True)
class LabelEntry:
    """One ``labels.csv`` row, its image path resolved against the site folder.

    Attributes
    ----------
    study_id : str
        Site-unique study identifier (never leaves the site).
    split : str
        ``"train"`` or ``"val"``.
    image : Path
        Absolute path of the DICOM series folder, NIfTI or ``.npy`` file.
    label : int or None
        0 or 1; ``None`` when the row's label is unusable (see ``error``).
    error : LabelError or None
        Why the row cannot be used (naming the manifest and line), else None.
    """

    study_id: str
    split: str
    image: Path
    label: int | None
    error: LabelError | None = None

    @property
    def is_valid(self) -> bool:
        """True when the row has a usable label."""
        return self.error is None


def _parse_label(text: str) -> int | None:
    """``"0"`` / ``"1"`` (also ``"0.0"`` / ``"1.0"`` from spreadsheets) -> int, anything else -> None."""
    try:
        value = float(text)
    except ValueError:
        return None
    if value in CLASSES:
        return int(value)
    return None


def read_label_manifest(site_dir: Path) -> list[LabelEntry]:
    """Read and validate ``site_dir / labels.csv``.

    Parameters
    ----------
    site_dir : Path
        The site folder.

    Returns
    -------
    list of LabelEntry
        The rows in file order (blank lines ignored), with absolute image
        paths. Rows whose label is missing or not in {0, 1} are returned with
        ``label=None`` and a :class:`LabelError`; image files are not checked here.

    Raises
    ------
    ManifestError
        If the manifest is missing or unreadable, its header is not
        ``study_id,split,image,label``, it lists no study, or a row has the
        wrong number of fields, an empty study id or image, an unknown split or
        a duplicate study id (the message gives the line number).
    """
    site_dir = Path(site_dir).resolve()
    path = site_dir / LABELS_NAME
    entries: list[LabelEntry] = []
    for line, r in read_manifest_rows(path, LABEL_COLUMNS, ("study_id", "image"), SPLITS,
                                      what="label manifest"):
        label_text = r["label"]
        label = _parse_label(label_text)
        error = None
        if label is None:
            what = "missing label" if not label_text else f"label {label_text!r} is not a class"
            error = LabelError(path, f"line {line} (study {r['study_id']}): {what}; "
                                     "expected 0 or 1")
        entries.append(LabelEntry(r["study_id"], r["split"], site_dir / r["image"], label,
                                  error))
    if not entries:
        raise ManifestError(path, "label manifest lists no study (empty site)")
    return entries


def write_label_manifest(site_dir: Path, entries: Iterable[LabelEntry]) -> Path:
    """Write ``site_dir / labels.csv`` (the folder is created) and return its path.

    Image paths, absolute or relative to ``site_dir``, are written relative to
    it (:func:`clients.csv_manifest.write_manifest_rows`).

    Raises
    ------
    ValueError
        On an unknown split, an empty or duplicate study id, or a label not in {0, 1}.
    """
    return write_manifest_rows(site_dir, LABELS_NAME, LABEL_COLUMNS, SPLITS, entries, _label_fields,
                               noun="study")


def _label_fields(entry: LabelEntry, relative: RelativePath) -> list[str]:
    """The ``image`` and ``label`` fields of a row to write; a label must be one of :data:`CLASSES`."""
    if entry.label not in CLASSES:
        raise ValueError(f"study {entry.study_id!r}: label {entry.label!r} is not one of {CLASSES}")
    return [relative(entry.image), str(entry.label)]


def load_ct3d_site(
    site_dir: Path,
    split: str | None,
    shape: tuple[int, int, int] = DEFAULT_SHAPE,
    *,
    level: float = LUNG_LEVEL,
    width: float = LUNG_WIDTH,
) -> tuple[list[LabelledVolume], LoadReport]:
    """Load every usable labelled volume of a site, skipping (and reporting) bad rows.

    Each volume goes through :func:`clients.ct_volume.load_ct_volume` (lung
    window, fixed grid). A row with a bad label, or whose image is missing,
    unreadable or of the wrong dimensions (any
    :class:`~clients.errors.StudyError`), is skipped: recorded in the report
    and logged as one warning line ``Skipping study <id>: <file>: <reason>``.

    Parameters
    ----------
    site_dir : Path
        The site folder holding ``labels.csv``.
    split : str or None
        ``"train"`` or ``"val"`` to load only that split; ``None`` loads all.
    shape : tuple of int, optional
        ``(D, H, W)`` grid. Default ``(32, 64, 64)``.
    level, width : float, optional
        HU window for DICOM / NIfTI images. Default lung window (-600, 1500).

    Returns
    -------
    volumes : list of (str, np.ndarray, int)
        ``(study_id, float32 (D, H, W) in [0, 1], label)`` in manifest order.
        May be empty if every row of the split was skipped (the task decides).
    report : LoadReport
        Loaded ids, and skipped ids with the reason (naming the file).

    Raises
    ------
    ManifestError
        If the manifest is missing, malformed or lists no study.
    ValueError
        If ``split`` is not ``None``, ``"train"`` or ``"val"``, or ``shape`` is bad.
    """
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
    entries = [e for e in read_label_manifest(Path(site_dir)) if split is None or e.split == split]
    volumes: list[LabelledVolume] = []
    report = LoadReport()
    for entry in entries:
        if entry.error is not None or entry.label is None:
            _skip(report, entry.study_id, entry.error or LabelError(entry.image, "no label"))
            continue
        try:
            volume = load_ct_volume(entry.image, shape, level=level, width=width)
        except StudyError as exc:
            _skip(report, entry.study_id, exc)
            continue
        volumes.append((entry.study_id, volume, entry.label))
        report.loaded.append(entry.study_id)
    return volumes, report


def _skip(report: LoadReport, study_id: str, error: StudyError) -> None:
    """Record a skipped study and log it on one line."""
    reason = " ".join(str(error).splitlines())  # one line, whatever the underlying library wrote
    report.skipped[study_id] = reason
    logger.warning("Skipping study %s: %s", study_id, reason)
