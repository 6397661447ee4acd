"""``make tracking-flush``: send MLflow what a federation left on disk during an outage.

A federation whose MLflow was unreachable at its end finishes anyway
(:func:`app.tracking.run_end.finish_run`) and keeps, in its checkpoint folder
``<checkpoint-dir>/<federation id>/``, the rounds MLflow lacks
(``tracking-outbox.jsonl``) and the end of the run (``tracking-end.json`` and the
two models' weights). Once MLflow answers again::

    make tracking-flush RUN_DIR=<that folder> TRACKING_URI=<the store>
    python -m app.tracking.flush <folder> [--tracking-uri URI]

sends the rounds in order, then logs and registers the final and the best model
and closes the run with the status the federation ended with. ``<folder>`` is one
federation's folder or a checkpoint-dir (every federation under it that holds an
end is sent; ``make tracking-flush`` without ``RUN_DIR`` takes ``make simulate``'s
``CHECKPOINT_DIR``). The tracking URI defaults to the one the federation used.
Running it again sends nothing twice: sent rounds leave the outbox, and the end
skips what MLflow already holds. A folder without an end (a federation that
stopped mid-run) is left to ``resume``, which sends its outbox itself.

Exit status: 0 when everything was sent (or nothing waited), 1 when MLflow still
did not take something (it stays on disk), 2 for a folder that does not exist.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import mlflow

from app.tracking.run_end import END_FILE, RunEnd, leave_open
from app.tracking.tracker import FederationTracker

__all__ = ["flush_folder", "main", "waiting_folders"]


def waiting_folders(folder: Path) -> list[Path]:
    """``folder`` when it holds a run's end, else its subfolders that do (a checkpoint-dir)."""
    if (folder / END_FILE).is_file():
        return [folder]
    return sorted(path.parent for path in folder.glob(f"*/{END_FILE}"))


def flush_folder(folder: Path, tracking_uri: str = "") -> str:
    """Send the outbox and the end ``folder`` holds; returns what was sent, in words.

    Raises
    ------
    Exception
        Whatever MLflow raises when it does not take the end (the files stay).
    """
    end = RunEnd.load(folder)
    if end is None:
        return f"{folder}: nothing waits"
    end.tracking_uri = tracking_uri or end.tracking_uri
    mlflow.set_tracking_uri(end.tracking_uri)
    tracker = FederationTracker.of_run(end.run_id, end.tracking_uri, end.experiment, folder)
    rounds = [record.step for record in tracker.outbox.pending]
    if not tracker.flush():
        raise ConnectionError(f"MLflow at {end.tracking_uri} did not take the rounds "
                              f"{[r.step for r in tracker.outbox.pending]} of run {end.run_id}")
    end.opened_as(tracker.run_id)  # a start that waited with the rounds
    try:
        models = end.send()
    finally:
        leave_open()
    return (f"run {end.run_id}: round(s) {rounds or 'none'} sent; best model "
            f"{models.best_uri or 'none (no round was evaluated)'} "
            f"({models.best_version or 'not registered'}), final model {models.final_uri} "
            f"({models.final_version or 'not registered'}); status {end.status}")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m app.tracking.flush", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path,
                        help="a federation's checkpoint folder, or a checkpoint-dir")
    parser.add_argument("--tracking-uri", default="",
                        help="the MLflow store (default: the one the federation used)")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        print(f"error: {args.folder}: no such folder (RUN_DIR: a federation's checkpoint "
              "folder or the checkpoint-dir)", file=sys.stderr)
        return 2
    folders = waiting_folders(args.folder.resolve())
    if not folders:
        print(f"nothing waits for MLflow under {args.folder} (no {END_FILE})")
        return 0
    failed = 0
    for folder in folders:
        try:
            print(flush_folder(folder, args.tracking_uri), flush=True)
        except Exception as exc:  # noqa: BLE001 - report each folder, keep its files
            failed += 1
            text = str(exc).splitlines()[0] if str(exc) else ""
            print(f"error: {folder}: not sent ({type(exc).__name__}: {text}); its files stay, "
                  "run the command again once MLflow answers", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
