"""What the console's pages show, as plain functions over the site's state dir and policy.

Each function returns plain data (dicts, lists, strings) for one page of
:mod:`app.site_runtime.console`, so it is tested without HTTP. Nothing here
writes: the console reads what the site runtime wrote (SHARED DESIGN 3-5 of
issue #33):

* the audit log (:mod:`app.site_runtime.audit_log`) and its chain check
  (:mod:`app.site_runtime.audit_chain`), read through :class:`AuditView`, which
  re-reads and re-verifies only when a segment's size or mtime changed;
* ``<state-dir>/audit/node-status.json``: the node counts as connected while the
  file is younger than :data:`CONNECTED_SECONDS` and its process is alive;
* ``<state-dir>/data-report/<dataset-id>.json``: items per split, skipped items
  with their reasons (they may name files: the Data page is local only).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import threading
from collections import Counter
from dataclasses import fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from app.site_runtime.audit_chain import ChainReport, verify_chain
from app.site_runtime.audit_log import HEAD_NAME, AuditLog, audit_dir
from app.site_runtime.site_audit import STATUS_NAME
from clients.site.data_report import DATA_REPORT_DIR
from clients.site.policy import SitePolicy
from strategies.errors import FedMedError

__all__ = ["ACTIVITY_COLUMNS", "AuditView", "CONNECTED_SECONDS", "DECISIONS", "activity_csv",
           "activity_rows", "chain_banner", "data_reports", "node_status", "overview",
           "policy_sections"]

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


class AuditView:
    """The audit log as the console reads it: records and chain status, cached.

    Parameters
    ----------
    state_dir : Path
        The site's state dir.
    archive : Path, optional
        Where the hospital moved rotated segments: verified as if in place (their
        records are not listed).

    Notes
    -----
    The cache key is the name, size and mtime of every segment and of ``head.json``
    (and of the archive's segments), so a page refresh with no new record neither
    re-reads nor re-verifies the log.
    """

    def __init__(self, state_dir: Path, archive: Path | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.archive = archive
        self._lock = threading.Lock()
        self._key: tuple[Any, ...] | None = None
        self._records: list[dict[str, Any]] = []
        self._error = ""
        self._chain: ChainReport | None = None

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
        records: list[dict[str, Any]] = []
        error = ""
        if key:
            try:
                records.extend(AuditLog(self.state_dir).records())
            except (FedMedError, OSError, ValueError) as exc:
                error = str(exc)
        self._records, self._error, self._key = records, error, key
        self._chain = verify_chain(self.state_dir, self.archive) if key else None

    def snapshot(self) -> tuple[list[dict[str, Any]], str, ChainReport | None]:
        """``(records in seq order, read error or "", ChainReport or None when no log)``."""
        with self._lock:
            self._refresh()
            return self._records, self._error, self._chain


def chain_banner(chain: ChainReport | None) -> dict[str, Any]:
    """The Overview's chain line: ``ok`` and its text."""
    if chain is None:
        return {"ok": True, "text": "no audit log yet (no message received)"}
    if chain.ok:
        return {"ok": True, "text": f"audit log verified, {chain.records} records"}
    return {"ok": False, "text": chain.message()}


def overview(records: list[dict[str, Any]], today: str | None = None) -> dict[str, Any]:
    """The last message record and today's (UTC) message counts by decision.

    The three decisions are always counted (0 when none); any other value a record
    carries is counted after them.
    """
    today = today or datetime.now(timezone.utc).date().isoformat()
    messages = [r for r in records if r.get("kind") == "message"]
    counts = Counter({decision: 0 for decision in DECISIONS})
    counts.update(str(r.get("decision")) for r in messages
                  if str(r.get("time", "")).startswith(today))
    return {"last": messages[-1] if messages else None, "today": today,
            "counts": dict(counts), "total": len(records)}


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


def activity_rows(records: list[dict[str, Any]], run: str = "", type_: str = "",
                  decision: str = "", kind: str = "") -> list[dict[str, Any]]:
    """The records that match every filter given, newest first, with a ``detail`` text.

    An empty filter matches everything; ``run`` compares as text (``"3"`` matches run 3).
    """
    wanted = {"run": run.strip(), "type": type_.strip(), "decision": decision.strip(),
              "kind": kind.strip()}
    rows = []
    for record in reversed(records):
        if all(not value or str(record.get(key, "")) == value for key, value in wanted.items()):
            rows.append({**record, "detail": _detail(record)})
    return rows


def _csv_cell(value: Any) -> Any:
    """A cell a spreadsheet will not run as a formula (coordinator strings are untrusted)."""
    if value is None:
        return ""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def activity_csv(rows: list[dict[str, Any]]) -> str:
    """The rows as CSV, one line per record, columns :data:`ACTIVITY_COLUMNS`."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([header for header, _ in ACTIVITY_COLUMNS])
    for row in rows:
        writer.writerow([_csv_cell(row.get(key)) for _, key in ACTIVITY_COLUMNS])
    return out.getvalue()


def _skipped(value: Any) -> list[tuple[str, str]]:
    return sorted((str(k), str(v)) for k, v in value.items()) if isinstance(value, dict) else []


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
                   "skipped": _skipped(split.get("skipped"))}
                  for name, split in report["splits"].items() if isinstance(split, dict)]
        skipped = [(split["name"], item, reason) for split in splits
                   for item, reason in split["skipped"]]
        skipped += [("(all)", item, reason) for item, reason in _skipped(report.get("skipped"))]
        reports.append({"dataset": str(report.get("dataset", path.stem)),
                        "task": str(report.get("task", "")), "time": str(report.get("time", "")),
                        "splits": splits, "skipped": skipped, "error": ""})
    return reports
