"""Reading and writing a site's CSV manifest: one table-of-contents format, checked in one place.

Every task keeps a small CSV in the site folder (``manifest.csv`` for PE
segmentation, ``images.csv`` for radiographs, ``labels.csv`` for CT volumes)
whose first column is a unique id and second the split (:data:`SPLITS`). A problem with the file
itself (missing, unreadable, empty, wrong header, a row with the wrong number of
fields, an empty required field, an unknown split, a duplicate id, a path that
leaves the site folder) makes the whole site unusable:
:class:`~clients.errors.ManifestError` with the line number.
A path column's value (relative to the site folder, or absolute) must stay inside
the site folder once resolved: ``../other/...``, an absolute path elsewhere and a
link inside the folder that resolves outside it are all refused, so a manifest can
never feed another folder's files to training. The site folder itself may be a
link (it is resolved first).
Writing (:func:`write_manifest_rows`) refuses an unknown split or an empty or
duplicate id with a :class:`ValueError` and stores paths relative to the site
folder (POSIX separators).
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from clients.errors import ManifestError

__all__ = ["SPLITS", "EVAL_SPLITS", "ManifestFormat", "read_manifest_rows", "write_manifest_rows"]

#: The splits of every task's manifest: ``train`` (local training and the loss probe), ``val``
#: (the evaluation the federation selects and stops on) and ``test`` (held out: evaluated only when
#: the server asks for it, never used for training or selection).
SPLITS = ("train", "val", "test")
#: The splits a site evaluates a model on.
EVAL_SPLITS = ("val", "test")


class ManifestEntry(Protocol):
    """A row to write: its ``split`` (the id is the attribute named like the first column)."""

    @property
    def split(self) -> str: ...


E = TypeVar("E", bound=ManifestEntry)
#: Maps a path (absolute, or relative to the site folder) to the POSIX path relative to the site folder.
RelativePath = Callable[[Path | str], str]


def read_manifest_rows(
    path: Path,
    columns: Sequence[str],
    required: Sequence[str],
    splits: Sequence[str],
    what: str = "manifest",
    paths: Sequence[str] = (),
) -> list[tuple[int, dict[str, str]]]:
    """Rows of the CSV at ``path`` as ``(line number, {column: stripped value})``.

    Blank lines are skipped. ``columns[0]`` is the id (unique), ``columns[1]``
    the split (one of ``splits``); the ``required`` columns must be non-empty;
    a non-empty value of a ``paths`` column must resolve inside ``path``'s folder
    (the site folder).

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
        for name in paths:
            if values[name] and not _inside(path.parent, values[name]):
                raise ManifestError(path, f"line {line}: {name} {values[name]!r} leaves the site "
                                          "folder (paths must stay inside it, links included)")
        key = values[columns[0]]
        if key in seen:
            raise ManifestError(path, f"line {line}: duplicate {columns[0]} {key!r}")
        seen.add(key)
        out.append((line, values))
    return out


def _inside(site_dir: Path, value: str) -> bool:
    """Whether ``value`` (relative to ``site_dir``, or absolute) resolves inside ``site_dir``."""
    root = site_dir.resolve()
    return (root / value).resolve().is_relative_to(root)


def write_manifest_rows(
    site_dir: Path,
    name: str,
    columns: Sequence[str],
    splits: tuple[str, ...],
    entries: Iterable[E],
    fields: Callable[[E, RelativePath], list[str]],
    *,
    noun: str,
) -> Path:
    """Write ``site_dir / name`` (the folder is created) and return its path; a file that
    already holds the same rows is left as it is (its mtime too), a new one replaces it
    whole (written beside it, then renamed).

    The file holds the ``columns`` header and one row per entry: the entry's id
    (its attribute named ``columns[0]``), its split (one of ``splits``), then
    ``fields(entry, relative)``, where ``relative`` turns a path, absolute or
    relative to ``site_dir``, into a POSIX path relative to ``site_dir``.
    ``noun`` (``"study"``, ``"image"``) names a row in the errors.

    Raises
    ------
    ValueError
        On a row with an unknown split or an empty or repeated id, checked before
        ``fields`` is called (which may raise its own); the file is then not written.
    """
    site_dir = Path(site_dir)
    site_dir.mkdir(parents=True, exist_ok=True)
    root = site_dir.resolve()

    def relative(target: Path | str) -> str:
        target = Path(target)
        absolute = target if target.is_absolute() else root / target
        return Path(os.path.relpath(absolute, root)).as_posix()

    id_column = columns[0]
    rows: list[list[str]] = []
    seen: set[str] = set()
    for entry in entries:
        key = getattr(entry, id_column)
        if entry.split not in splits:
            raise ValueError(f"{noun} {key!r}: bad split {entry.split!r}; expected one of {splits}")
        if not key or key in seen:
            raise ValueError(f"empty or duplicate {id_column} {key!r}")
        seen.add(key)
        rows.append([key, entry.split, *fields(entry, relative)])
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    data = text.getvalue().encode("utf-8")
    path = site_dir / name
    if path.is_file() and path.read_bytes() == data:
        return path  # unchanged: its mtime too, so a warm worker keyed by it stays warm
    partial = path.with_name(f".{name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)  # never a half-written manifest
    return path


@dataclass(frozen=True)
class ManifestFormat:
    """One task's manifest: file name, columns, required columns, splits, the noun of a row,
    the columns that hold paths (each kept inside the site folder).

    ``read`` and ``write`` are :func:`read_manifest_rows` and
    :func:`write_manifest_rows` with these settings, so each task's manifest
    module only maps a row to its own :class:`ManifestRow` and back.
    """

    name: str
    columns: tuple[str, ...]
    required: tuple[str, ...]
    splits: tuple[str, ...]
    noun: str
    what: str = "manifest"
    paths: tuple[str, ...] = ()  # the columns holding a path inside the site folder

    def read(self, site_dir: Path) -> tuple[Path, list[tuple[int, dict[str, str]]]]:
        """The resolved site folder and the rows ``(line, {column: value})`` of its manifest.

        Raises
        ------
        ManifestError
            For any problem with the file as a whole (see the module docstring).
        """
        site_dir = Path(site_dir).resolve()
        return site_dir, read_manifest_rows(site_dir / self.name, self.columns, self.required,
                                            self.splits, what=self.what, paths=self.paths)

    def write(self, site_dir: Path, entries: Iterable[E], fields: Callable[[E, RelativePath], list[str]]) -> Path:
        """Write ``site_dir / name`` (folder created), paths relative to it; return its path.

        Raises
        ------
        ValueError
            On an unknown split or an empty or repeated id (nothing is written).
        """
        return write_manifest_rows(site_dir, self.name, self.columns, self.splits, entries, fields,
                                   noun=self.noun)
