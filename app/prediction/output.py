"""The output folder of ``make predict``: created fresh, never inside the input nor holding it, CSV tables.

``OUT`` holds the task's predictor's outputs (a segmentation task's
``masks/<study>.nii.gz`` and ``findings.csv``, a classifier's
``predictions.csv``, the DICOM results in ``dicom/``;
:data:`clients.prediction.predictor.OUTPUTS`), ``skipped.csv`` (every item that
could not be read, with the reason) and ``dicom.csv`` (the DICOM results' index). An
existing non-empty ``OUT`` is refused unless ``overwrite``; then only these
outputs are replaced. ``OUT`` may not be ``DATA``, lie inside it or hold it: the
input folder is only read, and replacing OUT's outputs must never reach it.
"""

from __future__ import annotations

import csv
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

from clients.prediction import predictor
from strategies.wire.errors import ConfigError

__all__ = ["SKIPPED", "DICOM_INDEX", "OUTPUTS", "prepare_out", "write_table"]

SKIPPED = "skipped.csv"
#: The index of the DICOM results (:mod:`app.prediction.dicom_output`).
DICOM_INDEX = "dicom.csv"
#: Everything ``make predict`` writes into OUT (what ``overwrite`` replaces).
OUTPUTS = (*predictor.OUTPUTS, SKIPPED, DICOM_INDEX)


def prepare_out(out: Path, data: Path, overwrite: bool) -> Path:
    """Create ``out`` (or, with ``overwrite``, clear this tool's outputs in it) and return it resolved.

    Raises
    ------
    ConfigError
        If ``out`` is ``data``, inside it or holds it, is a file, or is a non-empty
        folder and ``overwrite`` is not set (checked before anything is deleted).
    """
    out, data = out.resolve(), data.resolve()
    if out == data or data in out.parents:
        raise ConfigError(f"OUT {out}: inside DATA {data}; the input folder is only read, "
                          "choose an output folder elsewhere")
    if out in data.parents:
        raise ConfigError(f"DATA {data}: inside OUT {out}; the input folder is only read and OUT's "
                          "outputs are replaced, choose an output folder that does not hold DATA")
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
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_table(path: Path, header: Sequence[str], rows: Iterable[Sequence[object]]) -> Path:
    """Write a CSV table (floats with 6 significant digits, ``None`` as empty) and return its path."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for row in rows:
            writer.writerow(["" if v is None else f"{v:.6g}" if isinstance(v, float) else v
                             for v in row])
    return path
