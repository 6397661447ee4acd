"""Round records waiting for MLflow, kept on the server's disk until MLflow has them.

A record is one round's metrics (one MLflow step, with the time the round
ended) and its JSON artifacts (dropped replies, selection); the end-of-federation
report (test metrics, the cross-site table, its tags and figures, step
``num-server-rounds + 1``) is one more record, its figures kept as files in
``tracking-files/`` until MLflow has them. The ServerApp
appends each round's record *before* it checkpoints the round and sends the
pending records afterwards (:class:`app.tracking.FederationTracker`), so an
MLflow outage never stalls or fails a round and nothing is lost: records wait
in ``tracking-outbox.jsonl`` (JSON lines, in the federation's checkpoint
folder) and go out in step order once MLflow answers. The file holds only
records not yet sent; it is rewritten atomically after each send.

A record (or the part of one) MLflow refuses -- a name past MLflow's limits,
a value it rejects -- is never retried: it is set aside with the reason in
``tracking-rejected.jsonl`` beside the outbox (:meth:`Outbox.set_aside`), so
it cannot block the rounds after it.

Without a checkpoint folder the outbox lives in memory (nothing survives a
crash then, as with the checkpoint).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from logging import WARNING
from typing import Any

from flwr.supercore import log

__all__ = ["FILES_DIR", "OUTBOX_FILE", "REJECTED_FILE", "Outbox", "RoundRecord"]

#: The outbox file in a federation's checkpoint folder.
OUTBOX_FILE = "tracking-outbox.jsonl"
#: Records MLflow refuses, with the reason, beside the outbox.
REJECTED_FILE = "tracking-rejected.jsonl"
#: Files waiting for MLflow (the end's figures), beside the outbox.
FILES_DIR = "tracking-files"


@dataclass
class RoundRecord:
    """One round as MLflow will store it.

    Attributes
    ----------
    step : int
        The server round (the MLflow step).
    timestamp_ms : int
        When the round ended (milliseconds since the epoch): a record sent late
        keeps the round's time.
    metrics : dict[str, float]
        MLflow metric name -> value.
    artifacts : dict[str, dict]
        Artifact path (``rounds/round-003-dropped.json``) -> JSON content.
    params : dict[str, str]
        Run params first known in this round (a site's policy fingerprint).
    tables : dict[str, dict[str, list]]
        MLflow tables (``cross-site/matrix.json``) -> their columns.
    tags : dict[str, str]
        Run tags (``test/withheld``).
    files : dict[str, str]
        Artifact path (``figures/val-dice.png``) -> the file on the server's disk
        holding it (:meth:`Outbox.file_for`); deleted once MLflow has it.
    """

    step: int
    timestamp_ms: int
    metrics: dict[str, float]
    artifacts: dict[str, dict[str, Any]] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    tables: dict[str, dict[str, list]] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)


class Outbox:
    """Pending :class:`RoundRecord` s, oldest first, on disk when ``path`` is given."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = None if path is None else Path(path)
        self._pending: list[RoundRecord] = []
        self._files: Path | None = None
        self.rejected: list[dict[str, Any]] = []
        if self.path is not None and self.path.is_file():
            with self.path.open(encoding="utf-8") as handle:
                for number, line in enumerate(handle, 1):
                    try:
                        self._pending.append(RoundRecord(**json.loads(line)))
                    except (ValueError, TypeError) as exc:
                        # A line cut by a crash mid-append: its round was not
                        # checkpointed, so it is run (and recorded) again.
                        log(WARNING, "%s line %d unreadable (%s); skipped", self.path,
                            number, exc)

    @property
    def pending(self) -> list[RoundRecord]:
        """The records not yet in MLflow, oldest first."""
        return list(self._pending)

    def append(self, record: RoundRecord) -> None:
        """Add a round's record (written to disk before this returns)."""
        self._pending.append(record)
        if self.path is not None:
            _append_line(self.path, asdict(record))

    def set_aside(self, record: RoundRecord, reason: str) -> None:
        """Keep ``record``, which MLflow refuses, out of the outbox: in ``rejected``
        and, with a folder, in ``tracking-rejected.jsonl`` with ``reason``."""
        entry = {**asdict(record), "reason": reason}
        self.rejected.append(entry)
        where = "memory" if self.path is None else self.path.parent / REJECTED_FILE
        if self.path is not None:
            _append_line(self.path.parent / REJECTED_FILE, entry)
        log(WARNING, "MLflow refuses round %d's %d metric(s) and %d param(s) (%s); set aside "
            "in %s", record.step, len(record.metrics), len(record.params), reason, where)

    def file_for(self, step: int, artifact: str) -> Path:
        """Where a file of step ``step`` that becomes ``artifact`` waits for MLflow: under
        ``tracking-files/`` beside the outbox (a temporary folder without one), named as
        the artifact (MLflow logs a file under its own name)."""
        if self._files is None:
            self._files = (self.path.parent / FILES_DIR if self.path is not None
                           else Path(tempfile.mkdtemp(prefix="fedmed-tracking-")))
        path = self._files / f"step-{step:03d}" / artifact
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def done(self, count: int) -> None:
        """The first ``count`` pending records are in MLflow: forget them (and their files)."""
        sent, rest = self._pending[:count], self._pending[count:]
        self._rewrite(rest)
        root = self._files or (None if self.path is None else self.path.parent / FILES_DIR)
        for record in sent:
            for file in map(Path, record.files.values()):
                file.unlink(missing_ok=True)
                for folder in file.parents:  # the step's folders, once empty
                    if folder == root or not folder.is_dir() or any(folder.iterdir()):
                        break
                    folder.rmdir()

    def keep(self, after_round: int, logged: set[int]) -> int:
        """On resume: drop records of rounds past ``after_round`` (they are redone) and
        of steps MLflow already has (``logged``); returns how many were dropped."""
        kept = [r for r in self._pending if r.step <= after_round and r.step not in logged]
        dropped = len(self._pending) - len(kept)
        self._rewrite(kept)
        return dropped

    def _rewrite(self, records: list[RoundRecord]) -> None:
        self._pending = list(records)
        if self.path is None:
            return
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.writelines(json.dumps(asdict(r)) + "\n" for r in records)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _append_line(path: Path, entry: dict[str, Any]) -> None:
    """Append ``entry`` as one JSON line to ``path``, on disk before this returns."""
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
