"""The site's tamper-evident audit log: append-only JSON lines, each chained to the previous one.

The site's runtime (never the uploaded app) writes one record per message it
received, and one per admin act (policy change, app approval or revocation,
budget reset), under ``<state-dir>/audit/``:

- ``audit.jsonl``: the segment being written, one record per line
  (JSON, ``sort_keys=True``, ``separators=(",", ":")``, UTF-8);
- ``audit-<first seq, 9 digits>.jsonl``: the segments rotated out by size;
- ``head.json``: ``{"seq", "hash"}`` of the last record written;
- ``.lock``: the ``fcntl.flock`` every writer holds (the site runner, the
  console and the admin commands are different processes).

:meth:`AuditLog.append` adds ``seq`` (0, 1, 2, ... over every segment),
``time`` (UTC, ISO 8601 with ``Z``, unless given), ``prev`` (the previous
record's ``hash``, :data:`GENESIS` for seq 0) and ``hash``, the SHA-256 of the
record's canonical JSON without its ``hash`` key (:func:`record_hash`). Each
line is one ``os.write`` on an ``O_APPEND`` descriptor, then ``os.fsync``; the
head is replaced atomically. An edit, a removal, a reordering or a cut of the
file then shows in :func:`app.site_runtime.audit_chain.verify_chain`.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from app.site_runtime.audit_format import (
    AUDIT_DIR, CURRENT_NAME, GENESIS, HEAD_NAME, LOCK_NAME, audit_dir, canonical_json,
    last_line, record_hash, segment_name, segment_paths,
)
from strategies.wire.errors import SiteError

__all__ = [  # the names of the format the log's users need come with it
    "AUDIT_DIR", "CURRENT_NAME", "HEAD_NAME", "GENESIS", "DEFAULT_MAX_BYTES",
    "AuditLogError", "AuditLog", "LogSnapshot", "audit_dir", "fsync_folder",
]

log = logging.getLogger("app.site_runtime.audit_log")

DEFAULT_MAX_BYTES = 8 * 2**20

#: The keys the log adds itself; a record handed to :meth:`AuditLog.append` may not carry them.
CHAIN_KEYS = ("seq", "prev", "hash")
FILE_MODE = 0o640
SCALARS = (str, int, float, bool, type(None))


class AuditLogError(SiteError):
    """The audit log cannot be written or read; the message names the file (and line)."""


def _utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _checked(record: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of ``record`` after checking its keys and values (JSON scalars or flat
    dicts of scalars, a ``kind``, none of the chain's keys)."""
    if not isinstance(record, Mapping):
        raise AuditLogError(f"audit record: a mapping is required, got {type(record).__name__}")
    for key in CHAIN_KEYS:
        if key in record:
            raise AuditLogError(f"audit record: key {key!r} is written by the log itself")
    if not isinstance(record.get("kind"), str) or not record["kind"]:
        raise AuditLogError("audit record: key 'kind' (a non-empty string) is required")
    if "time" in record and not isinstance(record["time"], str):
        raise AuditLogError("audit record: key 'time' must be an ISO 8601 string")
    for key, value in record.items():
        nested = type(value) is dict or (not isinstance(value, SCALARS)
                                         and isinstance(value, Mapping))
        inner = value.items() if nested else [("", value)]
        for sub, item in inner:
            name = f"{key}.{sub}" if sub else key
            if not isinstance(key, str) or not isinstance(sub, str):
                raise AuditLogError(f"audit record: key {name!r} is not a string")
            if not isinstance(item, SCALARS):
                raise AuditLogError(f"audit record: key {name!r} holds a "
                                    f"{type(item).__name__}, not a JSON scalar")
            if isinstance(item, float) and not math.isfinite(item):
                raise AuditLogError(f"audit record: key {name!r} is {item}, not a JSON number")
    return {key: value if isinstance(value, SCALARS) else dict(value)
            for key, value in record.items()}


def fsync_folder(folder: Path) -> None:
    """``os.fsync`` a folder, so that a file just created or renamed in it stays."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class LogSnapshot:
    """The log's files at one moment (:meth:`AuditLog.snapshot`): head.json's bytes (None
    when missing), ``(first seq, path)`` of the rotated segments in seq order (immutable
    once rotated), and the current segment's bytes (empty when missing)."""

    head: bytes | None
    rotated: list[tuple[int, Path]]
    current: bytes


class AuditLog:
    """The audit log of one site's state dir (:mod:`module docs <app.site_runtime.audit_log>`).

    Parameters
    ----------
    state_dir
        The site's state dir (the node config's, the ``STATE=`` of the make targets);
        the log lives in its ``audit/`` folder, created on the first append.
    max_bytes
        The current segment is rotated before an append once it holds this many bytes.
    sync
        ``os.fsync`` each line (and the head) before :meth:`append` returns.
    """

    def __init__(self, state_dir: str | Path, max_bytes: int = DEFAULT_MAX_BYTES,
                 sync: bool = True) -> None:
        if max_bytes < 1:
            raise AuditLogError(f"audit log max_bytes: {max_bytes} is not positive")
        self.folder = audit_dir(state_dir)
        self.current = self.folder / CURRENT_NAME
        self.head_path = self.folder / HEAD_NAME
        self.max_bytes = max_bytes
        self.sync = sync
        self._lock = threading.Lock()

    def append(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """Append ``record`` as the chain's next record; return it as written.

        Safe across threads and processes. Rotates the current segment first when
        it holds ``max_bytes`` or more.

        Returns
        -------
        dict
            The record as written: ``record`` with ``time``, ``seq``, ``prev``, ``hash``.

        Raises
        ------
        AuditLogError
            The record carries ``seq``/``prev``/``hash``, lacks ``kind`` or holds a
            value that is no JSON scalar (the message names the key); or the log's
            files cannot be written (the message names the file).
        """
        body = _checked(record)
        body.setdefault("time", _utc_now())
        with self._lock, self._flock(fcntl.LOCK_EX):
            try:
                tail, torn = last_line(self.current)
                seq, prev = self._previous(tail)
                body["seq"], body["prev"] = seq + 1, prev
                body["hash"] = record_hash(body)
                line = canonical_json(body) + b"\n"
                if self._rotate_if_full():
                    torn = False
                self._write_line(b"\n" + line if torn else line)
                self._write_head(body["seq"], body["hash"])
            except OSError as exc:
                raise AuditLogError(f"audit log {self.folder}: cannot append: {exc}") from exc
        return body

    def records(self) -> Iterator[dict[str, Any]]:
        """Yield every record of every segment (rotated ones first) in seq order.

        Yields
        ------
        dict
            Each record as written, the log's ``seq``, ``time``, ``prev`` and ``hash``
            included; the segments are those of one :meth:`snapshot`.

        Raises
        ------
        AuditLogError
            A line is not a JSON object (the message names the file and line).
        """
        snapshot = self.snapshot()
        for _, path in snapshot.rotated:
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise AuditLogError(f"audit log {path}: unreadable: {exc}") from exc
            yield from _parsed(path, data)
        yield from _parsed(self.current, snapshot.current)

    def snapshot(self) -> LogSnapshot:
        """Return head.json's bytes, the rotated segments and the current segment's bytes,
        all taken under the log's lock: no append or rotation is seen half done."""
        if not self.folder.is_dir():
            return LogSnapshot(None, [], b"")
        with self._flock(fcntl.LOCK_SH):
            try:
                head = self.head_path.read_bytes()
            except FileNotFoundError:
                head = None
            rotated = segment_paths(self.folder)
            try:
                current = self.current.read_bytes()
            except FileNotFoundError:
                current = b""
        return LogSnapshot(head, rotated, current)

    def reading(self) -> _FileLock:
        """The log's shared lock, for a reader that takes several files at one moment: no
        append or rotation happens while it is held (``with log.reading(): ...``)."""
        return self._flock(fcntl.LOCK_SH)

    def newest(self) -> tuple[int, str] | None:
        """``(seq, hash)`` of the last record written, the one the next append links to
        (``head.json``'s, or the newest line's when the head lags behind it); None before
        the first record."""
        if not self.folder.is_dir():
            return None
        with self._flock(fcntl.LOCK_SH):
            tail, _ = last_line(self.current)
            seq, digest = self._previous(tail)
        return None if seq < 0 else (seq, digest)

    def head(self) -> dict[str, Any] | None:
        """Return ``{"seq", "hash"}`` of the last record written, or None before the first."""
        try:
            head = json.loads(self.head_path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise AuditLogError(f"audit head {self.head_path}: unreadable: {exc}") from exc
        if not (isinstance(head, dict) and isinstance(head.get("seq"), int)
                and isinstance(head.get("hash"), str)):
            raise AuditLogError(f"audit head {self.head_path}: not {{\"seq\", \"hash\"}}")
        return head

    def _flock(self, mode: int) -> _FileLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        return _FileLock(self.folder / LOCK_NAME, mode)

    def _previous(self, tail: bytes | None) -> tuple[int, str]:
        """Return ``(seq, hash)`` of the last record (``(-1, GENESIS)`` before the first):
        head.json's, or the newest line's when head.json is missing, unreadable or behind
        that line (a write cut short between the line and the head)."""
        try:
            head = self.head()
        except AuditLogError as exc:
            log.warning("%s: continuing from the log's last line", exc)
            head = None
        try:
            newest = self._newest_record(tail)
        except AuditLogError as exc:
            if head is None:
                raise
            log.warning("%s: continuing from head.json", exc)
            newest = None
        if head is None:
            if newest is None:
                return -1, GENESIS
            log.warning("audit head %s missing: continuing from the last line of %s",
                        self.head_path, newest[2])
            return newest[0], newest[1]
        if newest is not None and newest[0] > head["seq"]:
            log.warning("audit head %s (seq %d) is behind %s (seq %d): continuing from the "
                        "segment's last line", self.head_path, head["seq"], newest[2], newest[0])
            return newest[0], newest[1]
        return head["seq"], head["hash"]

    def _newest_record(self, tail: bytes | None) -> tuple[int, str, Path] | None:
        """Return ``(seq, hash, file)`` of the newest complete line: ``tail`` (the current
        segment's) or, when the current segment has none, the newest rotated one's."""
        path = self.current
        if tail is None:
            for _, path in reversed(segment_paths(self.folder)):
                tail, _ = last_line(path)
                if tail is not None:
                    break
            else:
                return None
        try:
            record = json.loads(tail)
            return int(record["seq"]), str(record["hash"]), path
        except (ValueError, KeyError, TypeError) as exc:
            raise AuditLogError(f"audit log {path}: last line unreadable: {exc}") from exc

    def _rotate_if_full(self) -> bool:
        """Rename a full current segment to its rotated name; True if it was rotated."""
        try:
            size = self.current.stat().st_size
        except FileNotFoundError:
            return False
        if size < self.max_bytes:
            return False
        with open(self.current, "rb") as handle:
            first = handle.readline()
        try:
            target = self.folder / segment_name(int(json.loads(first)["seq"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise AuditLogError(f"audit log {self.current}:1: unreadable, not rotated: "
                                f"{exc}") from exc
        if target.exists():
            raise AuditLogError(f"audit log {target}: exists, {self.current} not rotated")
        os.replace(self.current, target)
        if self.sync:
            fsync_folder(self.folder)
        log.info("audit log rotated: %s -> %s", self.current.name, target.name)
        return True

    def _write_line(self, line: bytes) -> None:
        """One ``os.write`` of ``line`` on an ``O_APPEND`` descriptor, then ``os.fsync``."""
        if line.startswith(b"\n"):
            log.warning("audit log %s ends with a torn line: it stays, as a line of its own",
                        self.current)
        created = not self.current.exists()
        fd = os.open(self.current, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
        try:
            written = os.write(fd, line)
            if written != len(line):
                raise AuditLogError(f"audit log {self.current}: short write "
                                    f"({written} of {len(line)} bytes)")
            if self.sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if created and self.sync:
            fsync_folder(self.folder)

    def _write_head(self, seq: int, digest: str) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=HEAD_NAME, suffix=".tmp")
        try:
            os.fchmod(fd, FILE_MODE)
            os.write(fd, canonical_json({"hash": digest, "seq": seq}))
            if self.sync:
                os.fsync(fd)
            os.close(fd)
            fd = -1
            os.replace(tmp, self.head_path)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            Path(tmp).unlink(missing_ok=True)
            raise


class _FileLock:
    """``fcntl.flock`` on a lock file, opened afresh each time (a forked child never
    shares its parent's open lock)."""

    def __init__(self, path: Path, mode: int) -> None:
        self.path, self.mode, self.fd = path, mode, -1

    def __enter__(self) -> _FileLock:
        try:
            access = os.O_RDONLY if self.mode == fcntl.LOCK_SH else os.O_RDWR
            self.fd = os.open(self.path, access | os.O_CREAT, FILE_MODE)
        except OSError as exc:
            raise AuditLogError(f"audit lock {self.path}: {exc}") from exc
        try:
            fcntl.flock(self.fd, self.mode)
        except OSError as exc:
            os.close(self.fd)
            raise AuditLogError(f"audit lock {self.path}: {exc}") from exc
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _parsed(path: Path, data: bytes) -> Iterator[dict[str, Any]]:
    """Yield the records of one segment's bytes; a torn last line is left out."""
    lines = data.split(b"\n")
    for number, line in enumerate(lines[:-1], start=1):
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise AuditLogError(f"audit log {path}:{number}: not JSON: {exc}") from exc
        if not isinstance(record, dict):
            raise AuditLogError(f"audit log {path}:{number}: not a JSON object")
        yield record
