"""The output folder of ``make predict``: created fresh, never inside the input, CSV tables.

``OUT`` holds ``masks/<study>.nii.gz`` and ``findings.csv`` (``pe-seg``) or
``predictions.csv`` (classification), and ``skipped.csv`` (every item that
could not be read, with the reason). An existing non-empty ``OUT`` is refused
unless ``overwrite``; then only these outputs are replaced. ``OUT`` may not be
``DATA`` or lie inside it: the input folder is only read.
"""

from __future__ import annotations

import csv
import re
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

from strategies.errors import ConfigError

__all__ = ["OUTPUTS", "MASKS", "prepare_out", "mask_name", "write_table"]

MASKS = "masks"
#: Everything ``make predict`` writes into OUT (what ``overwrite`` replaces).
OUTPUTS = ("findings.csv", "predictions.csv", "skipped.csv", MASKS)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def prepare_out(out: Path, data: Path, overwrite: bool, masks: bool = False) -> Path:
    """Create ``out`` (or, with ``overwrite``, clear this tool's outputs in it) and return it resolved.

    ``masks``: also create ``out / masks`` (segmentation).

    Raises
    ------
    ConfigError
        If ``out`` is ``data`` or inside it, is a file, or is a non-empty
        folder and ``overwrite`` is not set.
    """
    out, data = out.resolve(), data.resolve()
    if out == data or data in out.parents:
        raise ConfigError(f"OUT {out}: inside DATA {data}; the input folder is only read, "
                          "choose an output folder elsewhere")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"OUT {out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise ConfigError(f"OUT {out}: exists and is not empty; choose a new folder or pass "
                              "--overwrite (make predict ... OVERWRITE=1)")
        for name in OUTPUTS:
            target = out / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    (out / MASKS if masks else out).mkdir(parents=True, exist_ok=True)
    return out


def mask_name(item_id: str, taken: set[str]) -> str:
    """A file name ``<id>.nii.gz`` for a study's mask: unsafe characters replaced, unique in ``taken``."""
    stem = _UNSAFE.sub("_", item_id).strip("._") or "study"
    name, n = f"{stem}.nii.gz", 1
    while name in taken:
        n += 1
        name = f"{stem}-{n}.nii.gz"
    taken.add(name)
    return name


def write_table(path: Path, header: Sequence[str], rows: Iterable[Sequence[object]]) -> Path:
    """Write a CSV table (floats with 6 significant digits, ``None`` as empty) and return its path."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for row in rows:
            writer.writerow(["" if v is None else f"{v:.6g}" if isinstance(v, float) else v
                             for v in row])
    return path
