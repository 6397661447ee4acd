"""The per-site label manifest of 3D CT classification (``labels.csv``).

A site folder holds ``labels.csv`` with the header ``study_id,split,image,label``:
one row per study; ``split`` is ``train``, ``val`` or ``test`` (held out, see
:data:`clients.manifests.csv_rows.SPLITS`); ``image`` is a DICOM
series folder, a ``.nii`` / ``.nii.gz`` HU file or a pre-windowed ``.npy``
volume, relative to the site folder (POSIX separators); ``label`` is the
volume-level class, ``0`` (negative) or ``1`` (positive, e.g. emphysema).

Two levels of failure, as for the PE manifest (:mod:`clients.pe_seg.manifest`):

* the table itself - missing file, wrong header, wrong field count, empty
  study id or image, unknown split, duplicate study id, no study at all -
  raises :class:`~clients.errors.ManifestError` (nothing at the site can be
  trusted);
* one row's **label** - missing, or not a class in {0, 1} - is a
  :class:`LabelError` (a :class:`~clients.errors.StudyError`) carried by that
  row's :class:`ManifestRow`; :func:`clients.ct3d_cls.data.load_site` skips
  the row, counts it and logs one line, like a study whose image is unreadable.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from clients.manifests.csv_rows import SPLITS, ManifestFormat, RelativePath
from clients.errors import LabelError, ManifestError

__all__ = [
    "MANIFEST_NAME",
    "MANIFEST_COLUMNS",
    "SPLITS",
    "CLASSES",
    "LabelError",
    "ManifestRow",
    "read_manifest",
    "write_manifest",
]

MANIFEST_NAME = "labels.csv"
MANIFEST_COLUMNS = ("study_id", "split", "image", "label")
CLASSES = (0, 1)
FORMAT = ManifestFormat(MANIFEST_NAME, MANIFEST_COLUMNS, ("study_id", "image"), SPLITS, noun="study",
                        what="label manifest", paths=("image",))


@dataclass(frozen=True)
class ManifestRow:
    """One ``labels.csv`` row: the site-unique ``study_id`` (never leaves the site), its
    ``split`` (``train`` / ``val`` / ``test``), the absolute ``image`` (DICOM series folder,
    NIfTI or ``.npy`` file), the ``label`` (0 or 1; ``None`` when unusable) and the
    ``error`` (a :class:`LabelError` naming the manifest and line) that makes it unusable."""

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


def read_manifest(site_dir: Path) -> list[ManifestRow]:
    """The rows of ``site_dir / labels.csv`` in file order, image paths made absolute.

    A row whose label is missing or not in {0, 1} is returned with
    ``label=None`` and a :class:`LabelError`; image files are not checked here.

    Raises
    ------
    ManifestError
        If the manifest is missing or malformed
        (:class:`~clients.manifests.csv_rows.ManifestFormat`), or lists no study.
    """
    site_dir, rows = FORMAT.read(site_dir)
    path = site_dir / MANIFEST_NAME
    entries: list[ManifestRow] = []
    for line, r in rows:
        label_text = r["label"]
        label = _parse_label(label_text)
        error = None
        if label is None:
            what = "missing label" if not label_text else f"label {label_text!r} is not a class"
            error = LabelError(path, f"line {line} (study {r['study_id']}): {what}; "
                                     "expected 0 or 1")
        entries.append(ManifestRow(r["study_id"], r["split"], site_dir / r["image"], label,
                                  error))
    if not entries:
        raise ManifestError(path, "label manifest lists no study (empty site)")
    return entries


def write_manifest(site_dir: Path, entries: Iterable[ManifestRow]) -> Path:
    """Write ``site_dir / labels.csv`` (the folder is created) and return its path.

    Image paths, absolute or relative to ``site_dir``, are written relative to
    it (:func:`clients.manifests.csv_rows.write_manifest_rows`).

    Raises
    ------
    ValueError
        On an unknown split, an empty or duplicate study id, or a label not in {0, 1}.
    """
    return FORMAT.write(site_dir, entries, _label_fields)


def _label_fields(entry: ManifestRow, relative: RelativePath) -> list[str]:
    """The ``image`` and ``label`` fields of a row to write; a label must be one of :data:`CLASSES`."""
    if entry.label not in CLASSES:
        raise ValueError(f"study {entry.study_id!r}: label {entry.label!r} is not one of {CLASSES}")
    return [relative(entry.image), str(entry.label)]
