"""What the console's pages show, as plain functions over the site's state dir and policy.

Each function returns plain data (dicts, lists, strings) for one page of
:mod:`app.site_runtime.console`, so it is tested without HTTP. Nothing here
writes: the console reads what the site runtime wrote (SHARED DESIGN 3-5 of
issue #33):

* the audit log (:mod:`app.site_runtime.audit_log`) and its chain check, read
  through :class:`AuditView`: it reads and verifies only the records appended since
  the last page (:mod:`app.site_runtime.audit_follow`), and keeps them in
  :class:`AuditRecords`, indexed for the Overview's counts and the Activity filters,
  so a page costs the same at 100 or 100,000 records;
* ``<state-dir>/audit/node-status.json``: the node counts as connected while the
  file is younger than :data:`CONNECTED_SECONDS` and its process is alive;
* ``<state-dir>/data-report/<dataset-id>.json``: items per split, skipped items
  with their reasons (they may name files: the Data page is local only);
* ``<state-dir>/pacs/<cohort>/pacs-report.json``: a PACS cohort's last sync (its size,
  counts, MB/s and skipped studies with their reasons, :mod:`clients.pacs.sync`).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import threading
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from app.site_runtime.audit_chain import ChainReport
from app.site_runtime.audit_follow import AuditFollower
from app.site_runtime.audit_log import HEAD_NAME, AuditLog, audit_dir
from app.site_runtime.site_audit import STATUS_NAME
from clients.pacs.sync import REPORT_NAME, STORE_DIR
from clients.site.data_report import DATA_REPORT_DIR
from clients.site.policy import SitePolicy
from strategies.wire.errors import FedMedError

__all__ = ["ACTIVITY_COLUMNS", "ActivityRows", "AuditRecords", "AuditView", "CONNECTED_SECONDS",
           "DECISIONS", "FILTER_KEYS", "activity_csv", "activity_rows", "chain_banner",
           "data_reports", "node_status", "overview", "pacs_cohorts", "policy_sections"]

log = logging.getLogger("fedmed.console")

#: A node-status file older than this (seconds) means the node is not connected.
CONNECTED_SECONDS = 30.0
#: The decisions of a message record (SHARED DESIGN 3 of issue #33).
DECISIONS = ("answered", "refused", "failed")
#: The Activity table's and the CSV's columns: (header, record key).
ACTIVITY_COLUMNS = (("seq", "seq"), ("time", "time"), ("kind", "kind"), ("run", "run"),
                    ("federation", "federation"), ("type", "type"), ("decision", "decision"),
                    ("rule", "rule"), ("bytes", "bytes_sent"), ("epsilon", "epsilon"),
                    ("seconds", "seconds"), ("error code", "error_code"), ("app", "app"),
                    ("detail", "detail"))
#: The record keys the Activity page filters on (compared as text).
FILTER_KEYS = ("run", "type", "decision", "kind")


def _read_json(path: Path) -> tuple[Any, str]:
    """``(value, "")`` of a JSON file, or ``(None, why not)``."""
    try:
        return json.loads(path.read_text(encoding="utf-8")), ""
    except FileNotFoundError:
        return None, f"{path.name}: not written yet"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"{path.name}: unreadable ({exc})"


def _parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)


def _alive(pid: Any) -> bool:
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def node_status(state_dir: Path, now: datetime | None = None) -> dict[str, Any]:
    """The node's status file, with ``connected`` and the ``reason`` when it is not."""
    path = audit_dir(state_dir) / STATUS_NAME
    status, problem = _read_json(path)
    if not isinstance(status, dict):
        return {"connected": False, "reason": problem or f"{STATUS_NAME}: not an object"}
    now = now or datetime.now(timezone.utc)
    stamp = _parse_time(status.get("time"))
    age = (now - stamp).total_seconds() if stamp else math.inf
    if not _alive(status.get("pid")):
        reason = f"the node process (pid {status.get('pid')}) is not running"
    elif age > CONNECTED_SECONDS:
        reason = f"no successful ask to the SuperNode for {age:.0f} s"
    elif status.get("runtime_api") != "ok":
        reason = "the SuperNode's Runtime API is unreachable"
    else:
        reason = ""
    return {**status, "connected": not reason, "reason": reason,
            "age": None if math.isinf(age) else round(age, 1)}


class AuditRecords(Sequence[dict[str, Any]]):
    """The audit records in seq order, indexed as they are added: the positions of each
    value of :data:`FILTER_KEYS`, the message decisions per day, the last message."""

    def __init__(self, records: Iterable[dict[str, Any]] = ()) -> None:
        self._items: list[dict[str, Any]] = []
        self._positions: dict[tuple[str, str], array] = {}
        self._days: dict[str, Counter[str]] = {}
        self._last_message: int | None = None
        self.extend(records)

    def extend(self, records: Iterable[dict[str, Any]]) -> None:
        """Add ``records`` (the next ones in seq order) and index them."""
        for record in records:
            position = len(self._items)
            self._items.append(record)
            for key in FILTER_KEYS:
                self._positions.setdefault((key, str(record.get(key, ""))),
                                           array("q")).append(position)
            if record.get("kind") == "message":
                self._last_message = position
                day = str(record.get("time", ""))[:10]
                self._days.setdefault(day, Counter())[str(record.get("decision"))] += 1

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index: Any) -> Any:  # a record, or a list of them for a slice
        return self._items[index]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._items)

    def __reversed__(self) -> Iterator[dict[str, Any]]:
        return reversed(self._items)

    def matching(self, wanted: dict[str, str]) -> Sequence[int]:
        """The positions, ascending, of the records whose every key in ``wanted`` with a
        non-empty value has that value as text; read from the index of the rarest value."""
        active = [(key, value) for key, value in wanted.items() if value]
        if not active:
            return range(len(self._items))
        lists = [self._positions.get(pair, array("q")) for pair in active]
        rarest = min(lists, key=len)
        if len(active) == 1:
            return rarest
        return [position for position in rarest
                if all(str(self._items[position].get(key, "")) == value for key, value in active)]

    def decisions_on(self, day: str) -> Counter[str]:
        """The message records' decisions on ``day`` (``YYYY-MM-DD``, UTC)."""
        return self._days.get(day, Counter())

    def last_message(self) -> dict[str, Any] | None:
        """The newest ``message`` record."""
        return None if self._last_message is None else self._items[self._last_message]


def _indexed(records: Sequence[dict[str, Any]]) -> AuditRecords:
    return records if isinstance(records, AuditRecords) else AuditRecords(records)


class AuditView:
    """The audit log as the console reads it: records and chain status, kept up to date.

    Parameters
    ----------
    state_dir : Path
        The site's state dir.
    archive : Path, optional
        Where the hospital moved rotated segments: verified as if in place (their
        records are not listed).

    Notes
    -----
    The name, size and mtime of every segment and of ``head.json`` (and of the
    archive's segments) tell whether anything changed: a page refresh with no new record
    reads nothing. After a change only the appended records are read and verified
    (:class:`~app.site_runtime.audit_follow.AuditFollower`); the whole log is verified
    again when a verified segment changed, and the chain banner and the console's log
    say so. A broken chain lists every record that still reads, as the log holds them.
    """

    def __init__(self, state_dir: Path, archive: Path | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.archive = archive
        self._lock = threading.Lock()
        self._key: tuple[Any, ...] | None = None
        self._follower = AuditFollower(self.state_dir, archive)
        self._records = AuditRecords()
        self._error = ""
        self._chain: ChainReport | None = None

    @property
    def parsed(self) -> int:
        """Records parsed since the view was made (each new record once)."""
        return self._follower.parsed

    def _signature(self) -> tuple[Any, ...]:
        entries = []
        for folder in (audit_dir(self.state_dir), self.archive):
            try:
                entries += sorted(os.scandir(folder), key=lambda e: e.name) if folder else []
            except FileNotFoundError:
                continue
        return tuple((e.path, e.stat().st_size, e.stat().st_mtime_ns) for e in entries
                     if e.name.endswith(".jsonl") or e.name == HEAD_NAME)

    def _refresh(self) -> None:
        key = self._signature()
        if key == self._key:
            return
        self._key = key
        if not key:
            self._records, self._error, self._chain = AuditRecords(), "", None
            return
        result = self._follower.refresh()
        self._chain = result.report
        if result.reason:
            log.warning("console: the audit log of %s was verified in full again: %s",
                        self.state_dir, result.reason)
        if result.report.ok:
            if result.full:
                self._records = AuditRecords()
            self._records.extend(result.records)
            self._error = ""
            return
        self._records, self._error = AuditRecords(), ""
        try:
            self._records.extend(AuditLog(self.state_dir).records())
        except (FedMedError, OSError, ValueError) as exc:
            self._error = str(exc)

    def snapshot(self) -> tuple[AuditRecords, str, ChainReport | None]:
        """``(records in seq order, read error or "", ChainReport or None when no log)``."""
        with self._lock:
            self._refresh()
            return self._records, self._error, self._chain


def chain_banner(chain: ChainReport | None) -> dict[str, Any]:
    """The Overview's chain line: ``ok`` and its text (how it was verified, when in full
    again after a change)."""
    if chain is None:
        return {"ok": True, "text": "no audit log yet (no message received)"}
    if chain.ok:
        note = f" ({chain.note})" if chain.note else ""
        return {"ok": True, "text": f"audit log verified, {chain.records} records{note}"}
    return {"ok": False, "text": chain.message()}


def overview(records: Sequence[dict[str, Any]], today: str | None = None) -> dict[str, Any]:
    """The last message record and today's (UTC) message counts by decision.

    The three decisions are always counted (0 when none); any other value a record
    carries is counted after them.
    """
    today = today or datetime.now(timezone.utc).date().isoformat()
    indexed = _indexed(records)
    counts = Counter({decision: 0 for decision in DECISIONS})
    counts.update(indexed.decisions_on(today))
    return {"last": indexed.last_message(), "today": today, "counts": dict(counts),
            "total": len(indexed)}


def _shown(value: Any) -> str:
    if isinstance(value, float) and math.isinf(value):
        return "no limit"
    if isinstance(value, tuple):
        return ", ".join(str(v) for v in value) if value else "(none)"
    if isinstance(value, bool):
        return "true" if value else "false"
    return "(none)" if value == "" else str(value)


def policy_sections(policy: SitePolicy) -> list[tuple[str, list[tuple[str, str]]]]:
    """Every rule of ``policy`` as ``(section, [(key, shown value)])``, as the file names them."""
    top: list[tuple[str, str]] = []
    sections: list[tuple[str, list[tuple[str, str]]]] = [("rules", top)]
    for spec in fields(policy):
        value = getattr(policy, spec.name)
        key = spec.name.replace("_", "-")
        if spec.name == "fingerprint":
            continue
        if hasattr(value, "__dataclass_fields__"):
            sections.append((key, [(f.name.replace("_", "-"), _shown(getattr(value, f.name)))
                                   for f in fields(value)]))
        else:
            top.append((key, _shown(value)))
    return sections


def _detail(record: dict[str, Any]) -> str:
    kind = record.get("kind")
    if kind == "policy-change":
        return (f"policy {record.get('previous')} -> {record.get('fingerprint')} "
                f"by {record.get('by')}")
    if kind == "node-start":
        return f"site {record.get('site')}, policy {record.get('policy')}"
    if kind == "message":
        asked = record.get("asked")
        return ", ".join(f"{k}={v}" for k, v in sorted(asked.items())) \
            if isinstance(asked, dict) else ""
    parts = [f"{key} {record[key]}" for key in ("dataset", "epsilon", "by", "reason")
             if record.get(key) not in (None, "")]
    return ", ".join(parts)


class ActivityRows(Sequence[dict[str, Any]]):
    """Records shown as Activity rows, newest first, each with its ``detail`` text; a row
    is made when it is read (a page reads its 200, not the whole log)."""

    def __init__(self, records: AuditRecords, positions: Sequence[int]) -> None:
        self._records, self._positions = records, positions

    def __len__(self) -> int:
        return len(self._positions)

    def __getitem__(self, index: Any) -> Any:  # a row, or a list of them for a slice
        if isinstance(index, slice):
            return [self[number] for number in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(f"activity row {index} of {len(self)}")
        record = self._records[self._positions[-1 - index % len(self)]]
        return {**record, "detail": _detail(record)}


def activity_rows(records: Sequence[dict[str, Any]], run: str = "", type_: str = "",
                  decision: str = "", kind: str = "") -> ActivityRows:
    """The records that match every filter given, newest first, with a ``detail`` text.

    An empty filter matches everything; ``run`` compares as text (``"3"`` matches run 3).
    """
    wanted = {"run": run.strip(), "type": type_.strip(), "decision": decision.strip(),
              "kind": kind.strip()}
    indexed = _indexed(records)
    return ActivityRows(indexed, indexed.matching(wanted))


def _csv_cell(value: Any) -> Any:
    """A cell a spreadsheet will not run as a formula (coordinator strings are untrusted)."""
    if value is None:
        return ""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def activity_csv(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as CSV, one line per record, columns :data:`ACTIVITY_COLUMNS`."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([header for header, _ in ACTIVITY_COLUMNS])
    for row in rows:
        writer.writerow([_csv_cell(row.get(key)) for _, key in ACTIVITY_COLUMNS])
    return out.getvalue()


def _skipped(value: Any) -> list[tuple[str, str]]:
    return sorted((str(k), str(v)) for k, v in value.items()) if isinstance(value, dict) else []


def pacs_cohorts(state_dir: Path) -> list[dict[str, Any]]:
    """Every PACS cohort the runtime synced (:mod:`clients.pacs.sync`): its name, the studies
    in the PACS and in the site's store, the last sync's time, counts and MB/s, and the
    skipped studies with their reasons (``pacs/<cohort>/pacs-report.json``)."""
    cohorts = []
    for path in sorted((Path(state_dir) / STORE_DIR).glob(f"*/{REPORT_NAME}")):
        report, problem = _read_json(path)
        name = path.parent.name
        if not isinstance(report, dict):
            cohorts.append({"name": name, "error": problem or "not a sync report"})
            continue
        synced = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)
        cohorts.append({
            "name": name, "error": "", "last_sync": synced.strftime("%Y-%m-%d %H:%M:%S UTC"),
            **{key: report.get(key, "—") for key in ("studies_in_pacs", "synced",
                                                     "fetched_studies", "removed")},
            "mb": f"{float(report.get('fetched_bytes', 0)) / 1e6:.1f}",
            "mb_per_s": f"{float(report.get('mb_per_s', 0)):.1f}",
            "skipped": _skipped(report.get("skipped"))})
    return cohorts


def data_reports(state_dir: Path) -> list[dict[str, Any]]:
    """Every data report of the site: task, dataset, time, items per split, skipped items.

    Skipped items are read per split (``splits.<name>.skipped``) and for the whole
    dataset (top-level ``skipped``, as :mod:`clients.site.data_report` writes them;
    shown with split ``(all)``).
    """
    reports = []
    for path in sorted((Path(state_dir) / DATA_REPORT_DIR).glob("*.json")):
        report, problem = _read_json(path)
        if not isinstance(report, dict) or not isinstance(report.get("splits"), dict):
            reports.append({"dataset": path.stem, "error": problem or "not a data report"})
            continue
        splits = [{"name": str(name), "loaded": split.get("loaded"),
                   "studies": split.get("studies", "—"),  # reports before issue 47: items only
                   "skipped": _skipped(split.get("skipped"))}
                  for name, split in report["splits"].items() if isinstance(split, dict)]
        skipped = [(split["name"], item, reason) for split in splits
                   for item, reason in split["skipped"]]
        skipped += [("(all)", item, reason) for item, reason in _skipped(report.get("skipped"))]
        reports.append({"dataset": str(report.get("dataset", path.stem)),
                        "task": str(report.get("task", "")), "time": str(report.get("time", "")),
                        "splits": splits, "skipped": skipped, "error": ""})
    return reports
