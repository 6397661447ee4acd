"""Reading a site's CSV manifest: one table-of-contents format, checked in one place.

Every task keeps a small CSV in the site folder (``manifest.csv`` for PE
segmentation, ``images.csv`` for radiographs, ``labels.csv`` for CT volumes)
whose first column is a unique id and second the split. A problem with the file
itself (missing, unreadable, empty, wrong header, a row with the wrong number of
fields, an empty required field, an unknown split, a duplicate id) makes the
whole site unusable: :class:`~clients.errors.ManifestError` with the line number.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from clients.errors import ManifestError

__all__ = ["read_manifest_rows"]


def read_manifest_rows(
    path: Path,
    columns: Sequence[str],
    required: Sequence[str],
    splits: Sequence[str],
    what: str = "manifest",
) -> list[tuple[int, dict[str, str]]]:
    """Rows of the CSV at ``path`` as ``(line number, {column: stripped value})``.

    Blank lines are skipped. ``columns[0]`` is the id (unique), ``columns[1]``
    the split (one of ``splits``); the ``required`` columns must be non-empty.

    Raises
    ------
    ManifestError
        For any problem with the file as a whole (see the module docstring).
    """
    columns = tuple(columns)
    if not path.is_file():
        raise ManifestError(path, f"site {what} is missing")
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ManifestError(path, f"cannot read the {what} ({type(exc).__name__}: {exc})") from exc
    if not rows:
        raise ManifestError(path, f"{what} is empty; expected the header {','.join(columns)}")
    header = tuple(cell.strip() for cell in rows[0])
    if header != columns:
        raise ManifestError(path, f"bad header {','.join(header)!r}; expected {','.join(columns)!r}")
    out: list[tuple[int, dict[str, str]]] = []
    seen: set[str] = set()
    for line, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue  # tolerate blank lines
        if len(row) != len(columns):
            raise ManifestError(path, f"line {line}: expected {len(columns)} fields, got {len(row)}")
        values = dict(zip(columns, (cell.strip() for cell in row)))
        for name in required:
            if not values[name]:
                raise ManifestError(path, f"line {line}: empty {name}")
        split = values[columns[1]]
        if split not in splits:
            raise ManifestError(path, f"line {line}: bad split {split!r}; expected one of {', '.join(splits)}")
        key = values[columns[0]]
        if key in seen:
            raise ManifestError(path, f"line {line}: duplicate {columns[0]} {key!r}")
        seen.add(key)
        out.append((line, values))
    return out
