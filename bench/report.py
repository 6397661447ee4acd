"""What every benchmark script does last: record the environment, write the JSON, print a table.

A printed table is declared once as columns: each :class:`Column` has a
heading, a format spec and a getter, so a header and its rows cannot drift
apart (the header takes the spec's alignment and width).
"""

from __future__ import annotations

import json
import platform
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["environment", "write_report", "Column", "print_table"]


def environment() -> dict:
    """Python and numpy versions and the thread count (the scripts run single-threaded)."""
    return {"python": platform.python_version(), "numpy": np.__version__, "threads": 1}


def write_report(path: Path, report: dict, *, indent: int = 2, allow_nan: bool = True) -> None:
    """Write ``report`` as indented JSON (one trailing newline), creating the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=indent, allow_nan=allow_nan) + "\n")


@dataclass(frozen=True)
class Column:
    """One column of a fixed-width table.

    Attributes
    ----------
    heading : str
        Printed in the header, aligned and padded like the values.
    spec : str
        Format spec of the values, e.g. ``"<12"``, ``"8.1f"``, ``"12,d"``
        (numbers align right unless the spec says otherwise).
    get : callable
        The value of a row.
    """

    heading: str
    spec: str
    get: Callable[[object], object]

    def head(self) -> str:
        """The heading with the alignment and width of ``spec``."""
        align, width = re.match(r"([<>^]?)(\d*)", self.spec).groups()
        return format(self.heading, f"{align or '>'}{width}")


def print_table(title: str, columns: Sequence[Column], rows: Iterable[object]) -> None:
    """A title line, the header, a rule as wide as it, then one line per row."""
    header = " ".join(c.head() for c in columns)
    print(title)
    print(header)
    print("-" * len(header))
    for row in rows:
        print(" ".join(format(c.get(row), c.spec) for c in columns))
