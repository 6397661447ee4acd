"""Apply a model the federation logged to a hospital's own studies: ``make predict`` / ``python -m app.predict``.

::

    python -m app.predict --model models:/fedmed-pe-seg-best/1 --data /abs/site --out /abs/out
                          [--split test] [--overwrite] [--device auto|cpu|cuda] [--tracking-uri URI]
                          [--personal /abs/site-folder-or-node-config.toml]
                          [--store-to /abs/cohort.toml --policy /abs/site-policy.toml
                           --state /abs/site-state]

The model (an MLflow URI, looked up in ``--tracking-uri``, which must exist: it is
never created, and an error names it; or a local model folder, such as a copy handed
to a hospital, applied with no store at all; :func:`app.model_source.load_logged_model`)
is weights plus metadata: its task and settings come with it, the network is built by
this product's code, and a folder holding a pickle is refused, naming the file.
``--data`` is a site folder (its manifest, all splits or
``--split``) or a plain folder of DICOM series / images
(:mod:`app.prediction.inputs`). Each item is read as in training, predicted
on CUDA with autocast when present (CPU otherwise) by the task's predictor
(:mod:`clients.prediction`), and one progress line per item goes to stderr.
Outputs (:mod:`app.prediction.output`): a segmentation task writes one NIfTI
mask per study on the series' grid plus ``findings.csv``; a classifier writes
``predictions.csv``; unreadable items are skipped and listed in
``skipped.csv``. Each item also goes back as DICOM, in its source's study
(:mod:`app.prediction.dicom_output`): a segmentation as a DICOM-SEG, a
classifier's probabilities as a TID 1500 measurement report, in ``dicom/``
with their index ``dicom.csv`` (a source that is not DICOM gets none, the
reason in the index). With references (the site's masks or labels) the task's
metric is printed at the end (Dice: mean over studies on the series' own grid;
ROC AUC: macro over labels), and so is the time per item.

With ``--personal`` (``make predict PERSONAL=...``), at a site of a federation
with personalisation, the site's personalised model is applied instead of the
global one: FedBN's kept normalisation layers from the site's state dir, or the
model adapted ``personalisation.finetune-steps`` steps on the site's training data
(:mod:`app.prediction.personalised`).

With ``--store-to`` (``make predict STORE_TO=...``) the DICOM objects written are then
stored in the PACS of that cohort file (STOW-RS or C-STORE, :mod:`clients.pacs.store`),
only where the site policy (``--policy``) sets ``[pacs] write-back = true`` and lists that
PACS in its ``endpoints``: otherwise nothing is predicted and one line names the rule
(``pacs.write-back``, ``pacs.endpoints``). An object not stored
gets one line and stays in ``dicom/``; a summary line counts them. Each store is audited:
``--state`` (``make predict STATE=...``, required with ``--store-to``) is the site's state
folder, the one its SuperNode runs with (``fedmed site init``'s ``supernodes/<site>/state``),
and a ``pacs-store`` record is appended to its audit log
(:func:`~app.site_runtime.site_audit.audit_pacs_store`): the objects stored and not stored by
kind (SEG, SR), bytes and the destination's kind (dicomweb, dimse), never a UID, a name or a
path; ``make audit-verify STATE=...`` checks it with the rest of the chain.

Exit status: 0 when at least one item was predicted (and every object asked to be
stored was), 1 when none could be or an object was not stored,
2 on a usage or configuration error (the message names the folder, file or URI).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TextIO

from app.config.product_paths import work_root
from app.model_source import LoggedModel, load_logged_model
from app.prediction.dicom_output import DicomResults, model_identity, written_files
from app.prediction.inputs import discover_items
from app.prediction.output import SKIPPED, prepare_out, write_table
from app.prediction.personalised import federation_of, personalise, site_of
from app.site_runtime.audit_log import AuditLogError
from app.site_runtime.site_audit import audit_pacs_store
from app.tracking.model_sparsity import runnable_network
from clients.pacs.cohort import Cohort, load_cohort
from clients.pacs.store import StoreReport, check_write_back, store_results
from clients.registry import task_class
from clients.site.policy import load_policy
from clients.training.trainer import ComputeDevice, select_device
from strategies.wire.errors import ConfigError, FedMedError, ItemError

__all__ = ["PredictSummary", "predict", "store_audited", "main"]

#: The MLflow store ``make simulate`` writes to (the Makefile's TRACKING_URI default).
DEFAULT_TRACKING_URI = f"sqlite:///{work_root() / 'mlflow.db'}"


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

    The model's task finds the items and predicts each one (its
    :meth:`~clients.training.site_task.SiteTask.predictor`); this loop times
    them, skips and lists the unreadable ones and writes the tables. Progress
    lines go to ``stream`` (default: ``sys.stderr`` at call time).

    Raises
    ------
    ConfigError
        If ``data`` is not a folder or holds no item, ``split`` does not apply,
        or ``out`` is refused (:func:`app.prediction.output.prepare_out`).
    ManifestError
        If the site's manifest is malformed.
    """
    data, stream = Path(data).resolve(), stream or sys.stderr
    task = task_class(logged.task)
    items = discover_items(task, data, split, logged.settings)
    if not items:
        raise ConfigError(f"DATA {data}: no {logged.task} item found"
                          + (f" in split {split!r}" if split else ""))
    out = prepare_out(Path(out), data, overwrite)
    compute = compute or select_device()
    logged.model.to(compute.device).eval()
    predictor = task.predictor(logged.model, logged.settings, compute, out)
    dicom = DicomResults(out, model_identity(logged, _product_version()))
    summary = PredictSummary(logged.task, out, metric=task.main_metric)
    rows: list[list[object]] = []
    skipped_rows: list[list[object]] = []
    for k, item in enumerate(items, 1):
        started = time.perf_counter()
        try:
            result = predictor.predict(item)
        except ItemError as exc:
            reason = " ".join(str(exc).splitlines())
            summary.skipped[item.item_id] = reason
            skipped_rows.append([item.item_id, _shown(item.image, data), reason])
            print(f"[{k}/{len(items)}] {item.item_id}: skipped: {reason}", file=stream, flush=True)
            continue
        seconds = time.perf_counter() - started
        summary.seconds.append(seconds)
        rows.append([item.item_id, item.split, _shown(item.image, data), *result.cells, seconds])
        note = dicom.write(item, result.dicom)
        print(f"[{k}/{len(items)}] {item.item_id}: {result.note} ({seconds:.2f} s)"
              + (f"; {note}" if note else ""), file=stream, flush=True)
    summary.predicted = len(rows)
    write_table(out / predictor.table, ["id", "split", "image", *predictor.columns, "seconds"], rows)
    write_table(out / SKIPPED, ["id", "image", "reason"], skipped_rows)
    dicom.finish()
    summary.value = predictor.metric()
    return summary


def _product_version() -> str:
    """The product's installed version (the DICOM objects' Software Versions)."""
    try:
        return importlib.metadata.version("fedmed")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _shown(path: Path, data: Path) -> str:
    """``path`` relative to ``data`` when inside it, else absolute (for the tables)."""
    try:
        return path.resolve().relative_to(data).as_posix()
    except ValueError:
        return str(path)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m app.predict", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True,
                        help="MLflow model URI (runs:/<run id>/best-model, models:/<name>/<version>) "
                             "or a local model folder (a copy of one; no store needed)")
    parser.add_argument("--data", required=True, type=Path,
                        help="a site folder (its manifest) or a folder of DICOM series / images")
    parser.add_argument("--out", required=True, type=Path,
                        help="output folder (created; may not be, lie inside or hold DATA)")
    parser.add_argument("--split", default=None, help="only this manifest split (e.g. test)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the outputs of an earlier run in a non-empty OUT")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI")
                        or DEFAULT_TRACKING_URI, help="MLflow tracking (and registry) store of a URI "
                        "MODEL; never created")
    parser.add_argument("--personal", default=None, type=Path,
                        help="apply this site's personalised model: its site folder or its "
                             "SuperNode's node-config TOML (data-path, state-dir, site-name)")
    parser.add_argument("--store-to", default=None, type=Path,
                        help="store the DICOM results in this cohort file's PACS (STOW-RS or "
                             "C-STORE); needs --policy with [pacs] write-back = true")
    parser.add_argument("--policy", default=None, type=Path,
                        help="the site policy that must allow --store-to ([pacs] write-back)")
    parser.add_argument("--state", default=None, type=Path,
                        help="the site's state folder, whose audit log records the store "
                             "(required with --store-to)")
    return parser


def _destination(store_to: Path | None, policy: Path | None,
                 state: Path | None) -> Cohort | None:
    """The results destination of ``--store-to``, checked against the site policy first, and
    the site's state folder that audits it."""
    if store_to is None:
        return None
    if policy is None:
        raise ConfigError("--store-to needs --policy (the site policy must allow [pacs] write-back)")
    if state is None:
        raise ConfigError("--store-to needs --state (the site's state folder: its audit log "
                          "records the store)")
    if not state.is_dir():
        raise ConfigError(f"--state {state}: no such folder (the site's state folder, the one "
                          "its SuperNode runs with)")
    rules, cohort = load_policy(policy), load_cohort(store_to)
    check_write_back(rules, cohort)
    return cohort


def store_audited(destination: Cohort, out: Path, state: Path,
                  stream: TextIO | None = None) -> StoreReport:
    """Store ``out``'s DICOM objects in ``destination``'s PACS, print the report's lines to
    ``stream`` (default ``sys.stdout``), and append the store's ``pacs-store`` record to
    ``state``'s audit log (module docstring).

    Raises
    ------
    AuditLogError
        The record could not be written (the objects were stored, and said so).
    """
    stored = store_results(destination, written_files(out))
    for line in stored.lines():
        print(line, file=stream or sys.stdout)
    audit_pacs_store(state, stored.counts())
    return stored


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s", stream=sys.stderr)
    try:
        destination = _destination(args.store_to, args.policy, args.state)
        import mlflow

        mlflow.set_tracking_uri(args.tracking_uri)
        logged = load_logged_model(args.model)
        compute = select_device(args.device)
        print(f"{logged.task} model {args.model} on {compute.device}", file=sys.stderr)
        if args.personal is not None:
            site = site_of(args.personal)
            federation, params = federation_of(logged)
            personal = personalise(logged, site, federation, params, compute)
            logged = replace(logged, model=personal.model)
            print(f"site {site.name}'s personalised model, {personal.note}", file=sys.stderr)
        if logged.pruning == "structured":  # run without the pruned channels: faster
            logged = replace(logged, model=runnable_network(
                logged.model, task_class(logged.task).example_input(logged.settings),
                logged.pruning))
            print("structured-pruned model: runs without its pruned channels", file=sys.stderr)
        summary = predict(logged, args.data, args.out, args.split, args.overwrite, compute)
    except (FedMedError, ValueError) as exc:
        print(f"predict: error: {exc}", file=sys.stderr)
        return 2
    for line in summary.lines():
        print(line)
    if destination is None:
        return 0 if summary.predicted else 1
    try:
        stored = store_audited(destination, summary.out, args.state)
    except AuditLogError as exc:
        print(f"predict: error: the store was not audited in {args.state}: {exc}", file=sys.stderr)
        return 1
    return 0 if summary.predicted and stored.stored == stored.total else 1


if __name__ == "__main__":
    sys.exit(main())
