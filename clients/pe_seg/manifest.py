"""The per-site study manifest (``manifest.csv``).

A site folder holds ``manifest.csv`` with the header ``study_id,split,image,mask``:
one row per study, ``split`` is ``train``, ``val`` or ``test`` (held out, see
:data:`clients.manifests.csv_rows.SPLITS`), ``image`` is the DICOM
series folder and ``mask`` the NIfTI label file, both relative to the site
folder (POSIX separators). The manifest is the site's table of contents: if it
is missing or malformed the site is unusable (:class:`ManifestError`); a
listed study whose files are bad is only skipped later by the study loader.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from clients.manifests.csv_rows import SPLITS, ManifestFormat

__all__ = ["MANIFEST_NAME", "MANIFEST_COLUMNS", "SPLITS", "ManifestRow", "read_manifest", "write_manifest"]

MANIFEST_NAME = "manifest.csv"
MANIFEST_COLUMNS = ("study_id", "split", "image", "mask")
FORMAT = ManifestFormat(MANIFEST_NAME, MANIFEST_COLUMNS, MANIFEST_COLUMNS, SPLITS, noun="study",
                        paths=("image", "mask"))


@dataclass(frozen=True)
class ManifestRow:
    """One ``manifest.csv`` row: the site-unique ``study_id`` (never leaves the site), its
    ``split`` (``train`` / ``val`` / ``test``), the absolute ``image_dir`` (DICOM series folder)
    and ``mask_path`` (NIfTI mask)."""

    study_id: str
    split: str
    image_dir: Path
    mask_path: Path


def read_manifest(site_dir: Path) -> list[ManifestRow]:
    """The rows of ``site_dir / manifest.csv`` in file order, paths made absolute (files not checked).

    Raises
    ------
    ManifestError
        If the manifest is missing or malformed (:class:`~clients.manifests.csv_rows.ManifestFormat`).
    """
    site_dir, rows = FORMAT.read(site_dir)
    return [ManifestRow(r["study_id"], r["split"], site_dir / r["image"], site_dir / r["mask"])
            for _, r in rows]


def write_manifest(site_dir: Path, entries: Iterable[ManifestRow]) -> Path:
    """Write ``site_dir / manifest.csv`` (paths relative to the site folder) and return its path.

    Raises
    ------
    ValueError
        On an unknown split, an empty or duplicate study id.
    """
    return FORMAT.write(site_dir, entries,
                        lambda entry, relative: [relative(entry.image_dir), relative(entry.mask_path)])
