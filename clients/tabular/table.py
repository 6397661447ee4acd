"""A tabular site's ``table.csv``: one row per patient, one column per clinical variable.

The header is ``patient_id,split,label,<feature columns...>``: the id (unique,
it never leaves the site), the split (``train`` / ``val`` / ``test``,
:data:`~clients.manifests.csv_rows.SPLITS`), the 0/1 ``label`` and at least one
feature column, named uniquely. A feature cell holds a number; an empty cell or
``nan`` (any case) is a missing value::

    patient_id,split,label,age,sex,chol
    p-000,train,1,63,1,233
    p-001,val,0,41,0,

The table follows the generic manifest rules (:mod:`clients.manifests.csv_rows`):
a missing or unreadable file, a malformed header, a row with the wrong number of
fields, an empty id or split, an unknown split or a duplicate id raise
:class:`~clients.errors.ManifestError` naming the file, and the site is
unusable. A problem of one row (a label outside {0, 1}, a cell that is not a
number or is infinite) only skips that row (:func:`parse_row` raises an
:class:`~strategies.wire.errors.ItemError`, counted in the load report).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clients.errors import LabelError, ManifestError, StudyError
from clients.manifests.csv_rows import SPLITS, ManifestFormat

__all__ = ["TABLE_NAME", "KEY_COLUMNS", "TableRow", "Table", "read_table", "write_table",
           "parse_row", "format_value"]

TABLE_NAME = "table.csv"
#: The first three columns of every table; the feature columns follow.
KEY_COLUMNS = ("patient_id", "split", "label")
#: Cells read as a missing value (compared in lower case).
MISSING_CELLS = ("", "nan")


def _format(features: tuple[str, ...]) -> ManifestFormat:
    """The manifest format of a table with these feature columns."""
    return ManifestFormat(TABLE_NAME, KEY_COLUMNS + features, ("patient_id", "split"), SPLITS,
                          noun="patient", what="table")


@dataclass(frozen=True)
class TableRow:
    """One row: ``patient_id``, ``split``, the raw ``label`` and feature ``values`` (checked by
    :func:`parse_row`), and its ``line`` in the file (1 = header)."""

    patient_id: str
    split: str
    label: str
    values: tuple[str, ...]
    line: int = 0


@dataclass(frozen=True)
class Table:
    """A site's table: its file, feature names (in column order) and rows (in file order)."""

    path: Path
    features: tuple[str, ...]
    rows: list[TableRow]


def _features_of(path: Path) -> tuple[str, ...]:
    """The feature columns named by the header of ``path``.

    Raises
    ------
    ManifestError
        If the file is missing, unreadable or empty, or its header does not start with
        ``patient_id,split,label`` followed by at least one uniquely named feature column.
    """
    if not path.is_file():
        raise ManifestError(path, "site table is missing")
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            header = next(csv.reader(handle), [])
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ManifestError(path, f"cannot read the table ({type(exc).__name__}: {exc})") from exc
    names = tuple(cell.strip() for cell in header)
    features = names[len(KEY_COLUMNS):]
    if (names[:len(KEY_COLUMNS)] != KEY_COLUMNS or not features or not all(features)
            or len(set(names)) != len(names)):
        raise ManifestError(path, f"bad header {','.join(names)!r}; expected "
                                  f"{','.join(KEY_COLUMNS)},<feature columns...> with at least one "
                                  "feature column, each named once")
    return features


def read_table(site_dir: Path) -> Table:
    """The table of ``site_dir`` (rows not yet parsed: :func:`parse_row`).

    Raises
    ------
    ManifestError
        For any problem of the file as a whole (see the module docstring).
    """
    path = Path(site_dir).resolve() / TABLE_NAME
    features = _features_of(path)
    _, rows = _format(features).read(path.parent)
    return Table(path, features, [
        TableRow(r["patient_id"], r["split"], r["label"], tuple(r[f] for f in features), line)
        for line, r in rows])


def parse_row(row: TableRow, table: Table) -> tuple[np.ndarray, float]:
    """A row's feature values (``float32``, NaN where missing) and its 0/1 label.

    Raises
    ------
    LabelError
        If the label is empty or not 0/1.
    StudyError
        If a cell is neither a number nor missing, or is infinite; the message names the
        line, the patient and the column.
    """
    where = f"line {row.line} (patient {row.patient_id})"
    if row.label.strip() not in ("0", "1", "0.0", "1.0"):
        raise LabelError(table.path, f"{where}: label {row.label!r} is not 0 or 1")
    values = np.empty(len(table.features), np.float32)
    for k, (name, cell) in enumerate(zip(table.features, row.values)):
        if cell.strip().lower() in MISSING_CELLS:
            values[k] = np.nan
            continue
        try:
            value = float(cell)
        except ValueError:
            raise StudyError(table.path, f"{where}: {name} = {cell!r} is not a number") from None
        if math.isinf(value):
            raise StudyError(table.path, f"{where}: {name} = {cell!r} is infinite")
        values[k] = value
    return values, float(row.label)


def format_value(value: float) -> str:
    """A feature cell: ``""`` for a missing value, else the shortest text of the number."""
    return "" if math.isnan(value) else f"{value:g}"


def write_table(site_dir: Path, features: Iterable[str], rows: Iterable[TableRow]) -> Path:
    """Write ``site_dir / table.csv`` (folder created) and return its path.

    Raises
    ------
    ValueError
        On an unknown split, an empty or repeated id, or a row whose number of values is not
        the number of ``features`` (nothing is written).
    """
    features = tuple(features)
    rows = list(rows)
    for row in rows:
        if len(row.values) != len(features):
            raise ValueError(f"patient {row.patient_id!r}: {len(row.values)} values for "
                             f"{len(features)} features")
    return _format(features).write(site_dir, rows, lambda row, _relative: [row.label, *row.values])
