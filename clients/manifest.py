"""The per-site study manifest (``manifest.csv``).

A site folder holds ``manifest.csv`` with the header ``study_id,split,image,mask``:
one row per study, ``split`` is ``train`` or ``val``, ``image`` is the DICOM
series folder and ``mask`` the NIfTI label file, both relative to the site
folder (POSIX separators). The manifest is the site's table of contents: if it
is missing or malformed the site is unusable (:class:`ManifestError`); a
listed study whose files are bad is only skipped later by the study loader.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from clients.csv_manifest import read_manifest_rows, write_manifest_rows

__all__ = ["MANIFEST_NAME", "MANIFEST_COLUMNS", "SPLITS", "StudyEntry", "read_manifest", "write_manifest"]

MANIFEST_NAME = "manifest.csv"
MANIFEST_COLUMNS = ("study_id", "split", "image", "mask")
SPLITS = ("train", "val")


@dataclass(frozen=True)
class StudyEntry:
    """One manifest row, with paths resolved against the site folder.

    Attributes
    ----------
    study_id : str
        Site-unique study identifier (never leaves the site).
    split : str
        ``"train"`` or ``"val"``.
    image_dir : Path
        Absolute path of the DICOM series folder.
    mask_path : Path
        Absolute path of the NIfTI mask.
    """

    study_id: str
    split: str
    image_dir: Path
    mask_path: Path


def read_manifest(site_dir: Path) -> list[StudyEntry]:
    """Read and validate ``site_dir / manifest.csv``.

    Parameters
    ----------
    site_dir : Path
        The site folder.

    Returns
    -------
    list of StudyEntry
        The rows in file order, with absolute paths. The files themselves are
        not checked here.

    Raises
    ------
    ManifestError
        If the manifest is missing or unreadable, its header is not
        ``study_id,split,image,mask``, a row has the wrong number of fields,
        an empty field, an unknown split, or a duplicate study id (the
        message gives the line number).
    """
    site_dir = Path(site_dir).resolve()
    rows = read_manifest_rows(site_dir / MANIFEST_NAME, MANIFEST_COLUMNS, MANIFEST_COLUMNS,
                              SPLITS)
    return [StudyEntry(r["study_id"], r["split"], site_dir / r["image"], site_dir / r["mask"])
            for _, r in rows]


def write_manifest(site_dir: Path, entries: Iterable[StudyEntry]) -> Path:
    """Write ``site_dir / manifest.csv`` (the folder is created) and return its path.

    The entries' paths, absolute or relative to ``site_dir``, are written
    relative to it (:func:`clients.csv_manifest.write_manifest_rows`).

    Raises
    ------
    ValueError
        On an unknown split, an empty or duplicate study id.
    """
    return write_manifest_rows(
        site_dir, MANIFEST_NAME, MANIFEST_COLUMNS, SPLITS, entries,
        lambda entry, relative: [relative(entry.image_dir), relative(entry.mask_path)], noun="study",
    )
