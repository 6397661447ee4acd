"""Apply a model the federation logged to a hospital's own studies: ``make predict`` / ``python -m app.predict``.

::

    python -m app.predict --model models:/fedmed-pe-seg-best/1 --data /abs/site --out /abs/out
                          [--split test] [--overwrite] [--device auto|cpu|cuda] [--tracking-uri URI]
                          [--personal /abs/site-folder-or-node-config.toml]

The model (an MLflow URI or a local MLflow model folder;
:func:`app.model_source.load_logged_model`) carries
its task and settings. ``--data`` is a site folder (its manifest, all splits or
``--split``) or a plain folder of DICOM series / images
(:mod:`app.prediction.inputs`). Each item is read as in training, predicted
on CUDA with autocast when present (CPU otherwise), and one progress line per
item goes to stderr. Outputs (:mod:`app.prediction.output`): ``pe-seg`` writes
one NIfTI mask per study on the series' grid plus ``findings.csv``; the
classifiers write ``predictions.csv``; unreadable items are skipped and listed
in ``skipped.csv``. With references (the site's masks or labels) the task's
metric is printed at the end (Dice: mean over studies on the series' own grid;
ROC AUC: macro over labels), and so is the time per item.

With ``--personal`` (``make predict PERSONAL=...``), at a site of a federation
with personalisation, the site's personalised model is applied instead of the
global one: FedBN's kept normalisation layers from the site's state dir, or the
model adapted ``personalisation.finetune-steps`` steps on the site's training data
(:mod:`app.prediction.personalised`).

Exit status: 0 when at least one item was predicted, 1 when none could be,
2 on a usage or configuration error (the message names the folder, file or URI).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TextIO

import numpy as np

from app.model_source import LoggedModel, load_logged_model
from app.prediction.classification import classify, read_input
from app.prediction.inputs import InputItem, discover_items
from app.prediction.output import MASKS, mask_name, prepare_out, write_table
from app.prediction.personalised import federation_of, personalise, site_of
from app.prediction.segmentation import segment_study
from clients.training.device import ComputeDevice, select_device
from strategies.errors import ConfigError, FedMedError, ItemError

__all__ = ["PredictSummary", "predict", "main"]

#: The MLflow store ``make simulate`` writes to (the Makefile's TRACKING_URI default).
DEFAULT_TRACKING_URI = f"sqlite:///{Path(__file__).resolve().parents[1] / 'mlflow.db'}"


@dataclass
class PredictSummary:
    """What a prediction run did.

    Attributes
    ----------
    task : str
        The model's task.
    out : Path
        The output folder.
    predicted : int
        Items predicted.
    skipped : dict of str to str
        Item id -> why it could not be read.
    metric : str
        The task's metric (``dice`` / ``auc``).
    value : float | None
        Its value over the items with a reference; ``None`` when there is none
        (or AUC is undefined: one class only).
    seconds : list of float
        Time per predicted item (read, predict, write).
    """

    task: str
    out: Path
    predicted: int = 0
    skipped: dict[str, str] = field(default_factory=dict)
    metric: str = ""
    value: float | None = None
    seconds: list[float] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The closing summary, one fact a line."""
        lines = [f"predicted {self.predicted} item(s), skipped {len(self.skipped)}"
                 + (f" (listed in {self.out / 'skipped.csv'})" if self.skipped else "")
                 + f"; outputs in {self.out}"]
        if self.value is not None:
            lines.append(f"{self.metric} = {self.value:.4f} (items with a reference)")
        if self.seconds:
            lines.append(f"time per item: mean {statistics.fmean(self.seconds):.2f} s, "
                         f"median {statistics.median(self.seconds):.2f} s, "
                         f"total {sum(self.seconds):.1f} s")
        return lines


def predict(logged: LoggedModel, data: Path, out: Path, split: str | None = None,
            overwrite: bool = False, compute: ComputeDevice | None = None,
            stream: TextIO | None = None) -> PredictSummary:
    """Predict every item of ``data`` with ``logged`` into ``out`` (see the module docstring).

    Progress lines go to ``stream`` (default: ``sys.stderr`` at call time).

    Raises
    ------
    ConfigError
        If ``data`` is not a folder or holds no item, ``split`` does not apply,
        or ``out`` is refused (:func:`app.prediction.output.prepare_out`).
    ManifestError
        If the site's manifest is malformed.
    """
    data, stream = Path(data).resolve(), stream or sys.stderr
    items = discover_items(logged.task, data, split, logged.settings.num_labels)
    if not items:
        raise ConfigError(f"DATA {data}: no {logged.task} item found"
                          + (f" in split {split!r}" if split else ""))
    out = prepare_out(Path(out), data, overwrite, masks=logged.task == "pe-seg")
    compute = compute or select_device()
    logged.model.to(compute.device).eval()
    summary = PredictSummary(logged.task, out, metric="dice" if logged.task == "pe-seg" else "auc")
    rows: list[list[object]] = []
    references: list[tuple[np.ndarray, np.ndarray]] = []
    dices: list[float] = []
    taken: set[str] = set()
    skipped_rows = []
    for k, item in enumerate(items, 1):
        started = time.perf_counter()
        try:
            if logged.task == "pe-seg":
                result, note, score = _segment(logged, item, out, taken, compute)
                dices += [] if score is None else [score]
            else:
                result, note, scores = _classify(logged, item, compute)
                references += [] if item.labels is None else [(scores, item.labels)]
        except ItemError as exc:
            reason = " ".join(str(exc).splitlines())
            summary.skipped[item.item_id] = reason
            skipped_rows.append([item.item_id, _shown(item.image, data), reason])
            print(f"[{k}/{len(items)}] {item.item_id}: skipped: {reason}", file=stream, flush=True)
            continue
        seconds = time.perf_counter() - started
        summary.seconds.append(seconds)
        rows.append([item.item_id, item.split, _shown(item.image, data), *result, seconds])
        print(f"[{k}/{len(items)}] {item.item_id}: {note} ({seconds:.2f} s)", file=stream, flush=True)
    summary.predicted = len(rows)
    _write_tables(logged, out, rows, skipped_rows)
    if logged.task == "pe-seg":
        summary.value = statistics.fmean(dices) if dices else None
    else:
        summary.value = _auc(references)
    return summary


def _segment(logged: LoggedModel, item: InputItem, out: Path, taken: set[str],
             compute: ComputeDevice) -> tuple[list[object], str, float | None]:
    """A study's mask written: its ``findings.csv`` cells, progress note, and Dice (if a reference)."""
    name = mask_name(item.item_id, taken)
    found = segment_study(logged.model, item.image, item.reference, out / MASKS / name,
                          logged.settings, compute)
    cells = [f"{MASKS}/{name}", found.voxels, found.volume_ml, found.max_probability, found.dice]
    return cells, f"{found.voxels} voxels ({found.volume_ml:.2f} ml)", found.dice


def _classify(logged: LoggedModel, item: InputItem,
              compute: ComputeDevice) -> tuple[list[object], str, np.ndarray]:
    """An item's ``predictions.csv`` cells, progress note, and probabilities."""
    scores = classify(logged.model, read_input(logged.task, item.image, logged.settings), compute)[0]
    cells = [float(s) for s in scores] + _labels(item, len(scores))
    return cells, "p = " + ", ".join(f"{s:.3f}" for s in scores), scores


def _labels(item: InputItem, count: int) -> list[object]:
    """The item's reference labels as table cells (empty when it has none)."""
    return [None] * count if item.labels is None else [int(v) for v in item.labels]


def _shown(path: Path, data: Path) -> str:
    """``path`` relative to ``data`` when inside it, else absolute (for the tables)."""
    try:
        return path.resolve().relative_to(data).as_posix()
    except ValueError:
        return str(path)


def _write_tables(logged: LoggedModel, out: Path, rows: list[list[object]],
                  skipped: list[list[object]]) -> None:
    """``findings.csv`` / ``predictions.csv`` and ``skipped.csv``."""
    head = ["id", "split", "image"]
    if logged.task == "pe-seg":
        write_table(out / "findings.csv", head + ["mask", "voxels", "volume_ml", "max_probability",
                                                  "dice", "seconds"], rows)
    else:
        n = logged.settings.num_labels
        names = ["probability"] if n == 1 else [f"probability_{j}" for j in range(n)]
        labels = ["label"] if n == 1 else [f"label_{j}" for j in range(n)]
        write_table(out / "predictions.csv", head + names + labels + ["seconds"], rows)
    write_table(out / "skipped.csv", ["id", "image", "reason"], skipped)


def _auc(pairs: list[tuple[np.ndarray, np.ndarray]]) -> float | None:
    """Macro ROC AUC over labels (Hanley & McNeil, Radiology 1982); ``None`` if a label has one class."""
    if not pairs:
        return None
    import torch

    from models.monai_core import compute_roc_auc

    scores = torch.tensor(np.stack([s for s, _ in pairs]), dtype=torch.float32)
    labels = torch.tensor(np.stack([y for _, y in pairs]), dtype=torch.float32)
    if not all(0 < int(labels[:, j].sum()) < len(labels) for j in range(labels.shape[1])):
        return None
    return float(compute_roc_auc(scores, labels, average="macro"))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m app.predict", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True,
                        help="MLflow model URI (runs:/<run id>/best-model, models:/<name>/<version>) "
                             "or a local MLflow model folder")
    parser.add_argument("--data", required=True, type=Path,
                        help="a site folder (its manifest) or a folder of DICOM series / images")
    parser.add_argument("--out", required=True, type=Path, help="output folder (created)")
    parser.add_argument("--split", default=None, help="only this manifest split (e.g. test)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the outputs of an earlier run in a non-empty OUT")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI")
                        or DEFAULT_TRACKING_URI, help="MLflow tracking (and registry) store")
    parser.add_argument("--personal", default=None, type=Path,
                        help="apply this site's personalised model: its site folder or its "
                             "SuperNode's node-config TOML (data-path, state-dir, site-name)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s", stream=sys.stderr)
    try:
        import mlflow

        mlflow.set_tracking_uri(args.tracking_uri)
        logged = load_logged_model(args.model)
        compute = select_device(args.device)
        print(f"{logged.task} model {args.model} on {compute.device}", file=sys.stderr)
        if args.personal is not None:
            site = site_of(args.personal)
            federation, params = federation_of(args.model)
            personal = personalise(logged, site, federation, params, compute)
            logged = replace(logged, model=personal.model)
            print(f"site {site.name}'s personalised model, {personal.note}", file=sys.stderr)
        summary = predict(logged, args.data, args.out, args.split, args.overwrite, compute)
    except (FedMedError, ValueError) as exc:
        print(f"predict: error: {exc}", file=sys.stderr)
        return 2
    for line in summary.lines():
        print(line)
    return 0 if summary.predicted else 1


if __name__ == "__main__":
    sys.exit(main())
