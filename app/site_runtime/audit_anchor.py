"""Anchors of the site's audit log: its head, kept where a rewriter of the log cannot reach.

The hash chain (:mod:`app.site_runtime.audit_log`) shows a record edited, removed or
reordered in place, but not a chain rewritten whole together with ``head.json``. An
anchor is the head at one moment, one line of canonical JSON::

    {"anchor":"fedmed-audit","hash":"<64 hex>","log":"/abs/state/audit","seq":99,
     "site":"hospital-a","time":"2025-01-31T09:00:00.000000Z"}

written where the site policy's ``[audit] anchor`` names (:class:`~clients.site.policy.AuditRules`):

- an absolute path: a file on another mount (a share the site may only append to); each
  anchor is one ``os.write`` on an ``O_APPEND`` descriptor, then ``os.fsync``
  (:class:`FileAnchor`);
- ``"syslog"``: the system log through its socket ``/dev/log`` (journald, rsyslog), from
  the identifier :data:`ANCHOR_IDENT`, facility ``authpriv``, with the stdlib's
  :class:`logging.handlers.SysLogHandler` (:class:`SyslogAnchor`); ``journalctl -t
  fedmed-audit -o cat`` lists them.

The site runtime anchors every ``anchor-every`` records and at every node stop
(:class:`app.site_runtime.site_audit.SiteAudit`); ``make audit-verify`` reads them back
(:func:`read_anchors`) and checks each one against the chain
(:mod:`app.site_runtime.audit_chain`). An anchor names its log by the audit folder's
absolute path, so one file or one journal may hold the anchors of several sites.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.site_runtime.audit_format import canonical_json
from app.site_runtime.audit_log import AuditLogError, fsync_folder
from clients.site.policy import SYSLOG_ANCHOR

__all__ = ["ANCHOR_IDENT", "SYSLOG_ADDRESS", "Anchor", "AnchorError", "AnchorSource",
           "FileAnchor", "SyslogAnchor", "anchor_writer", "read_anchors"]

#: The syslog identifier of every anchor, and the ``anchor`` key's value in its line.
ANCHOR_IDENT = "fedmed-audit"
#: The system log's socket.
SYSLOG_ADDRESS = "/dev/log"
FILE_MODE = 0o640
#: Seconds ``journalctl`` may take to list the anchors.
JOURNAL_SECONDS = 120


class AnchorError(AuditLogError):
    """An anchor cannot be written or read; the message names the file, socket or command."""


@dataclass(frozen=True)
class Anchor:
    """The head of one audit log at one moment: its folder, site, ``seq``, ``hash``, time."""

    log: str
    site: str
    seq: int
    hash: str
    time: str

    def line(self) -> bytes:
        """The anchor as one line of canonical JSON, without its newline."""
        return canonical_json({"anchor": ANCHOR_IDENT, **asdict(self)})

    def where(self) -> str:
        """``anchor seq N (time T)``, as the verifier names it."""
        return f"anchor seq {self.seq} ({self.time})"

    @classmethod
    def from_text(cls, text: str) -> Anchor | None:
        """The anchor a line holds (after any syslog prefix before its ``{``), or None."""
        start = text.find("{")
        if start < 0:
            return None
        try:
            found: Any = json.loads(text[start:])
        except ValueError:
            return None
        if not (isinstance(found, dict) and found.get("anchor") == ANCHOR_IDENT
                and type(found.get("seq")) is int and all(
                    isinstance(found.get(key), str) for key in ("log", "site", "hash", "time"))):
            return None
        return cls(found["log"], found["site"], found["seq"], found["hash"], found["time"])


class FileAnchor:
    """Anchors appended to a file on another mount, one line each, fsynced."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def write(self, anchor: Anchor) -> None:
        """Append ``anchor`` as one line with one ``os.write``, then ``os.fsync``.

        Raises
        ------
        AnchorError
            The file cannot be opened or written (the message names it).
        """
        line = anchor.line() + b"\n"
        try:
            created = not self.path.exists()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
            try:
                written = os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
            if created:
                fsync_folder(self.path.parent)
        except OSError as exc:
            raise AnchorError(f"audit anchor file {self.path}: cannot append: {exc}") from exc
        if written != len(line):
            raise AnchorError(f"audit anchor file {self.path}: short write ({written} of "
                              f"{len(line)} bytes)")


class _Handler(logging.handlers.SysLogHandler):
    """A syslog handler whose failures raise (the stdlib's print and carry on)."""

    def handleError(self, record: logging.LogRecord) -> None:
        raise  # pylint: disable=misplaced-bare-raise  # called inside emit's except block


class SyslogAnchor:
    """Anchors sent to the system log as identifier :data:`ANCHOR_IDENT`.

    Parameters
    ----------
    address
        The system log's Unix socket; default :data:`SYSLOG_ADDRESS`.
    """

    def __init__(self, address: str | None = None) -> None:
        self.address = address or SYSLOG_ADDRESS

    def write(self, anchor: Anchor) -> None:
        """Send ``anchor`` as one syslog message ``<prio>fedmed-audit: <json line>``.

        Raises
        ------
        AnchorError
            The socket is missing or refuses the message (the message names it).
        """
        handler = _Handler(self.address, logging.handlers.SysLogHandler.LOG_AUTHPRIV)
        handler.ident, handler.append_nul = f"{ANCHOR_IDENT}: ", False
        record = logging.makeLogRecord({"msg": anchor.line().decode("utf-8"),
                                        "levelno": logging.INFO, "levelname": "INFO"})
        try:
            handler.emit(record)
        except OSError as exc:
            raise AnchorError(f"audit anchor: the system log {self.address} refused it: "
                              f"{exc}") from exc
        finally:
            handler.close()


def anchor_writer(anchor: str) -> FileAnchor | SyslogAnchor | None:
    """Where the policy's ``[audit] anchor`` sends anchors: None for ``""`` (no anchor)."""
    if not anchor:
        return None
    return SyslogAnchor() if anchor == SYSLOG_ANCHOR else FileAnchor(anchor)


@dataclass(frozen=True)
class AnchorSource:
    """The anchors of one log as read back: in the order written, and where from.

    Attributes
    ----------
    anchors
        The anchors whose ``log`` is the verified log's folder.
    source
        Where they were read, in words (``anchor file ...``, ``journalctl -t fedmed-audit``,
        ``exported journal ...``).
    others
        Anchors of other logs found there (another site's, a moved state dir's).
    """

    anchors: tuple[Anchor, ...]
    source: str
    others: int = 0


def _parsed(text: str, log_folder: Path, source: str) -> AnchorSource:
    found = [anchor for line in text.splitlines() if (anchor := Anchor.from_text(line))]
    mine = tuple(anchor for anchor in found if anchor.log == str(log_folder))
    return AnchorSource(mine, source, len(found) - len(mine))


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise AnchorError(f"audit-verify: {what} {path}: unreadable: {exc}") from exc


def read_anchors(anchor: str, log_folder: str | Path, journal: str | Path | None = None
                 ) -> AnchorSource:
    """Read back the anchors of the log in ``log_folder`` from where ``anchor`` sent them.

    Parameters
    ----------
    anchor
        The policy's ``[audit] anchor``: ``"syslog"`` or an absolute path (not ``""``).
    log_folder
        The audit folder verified (``<state-dir>/audit``); made absolute.
    journal
        For ``"syslog"``: a file exported from the system log (``journalctl -t fedmed-audit
        -o cat``, or a syslog file); read instead of asking ``journalctl``.

    Raises
    ------
    AnchorError
        The anchor file or the exported journal cannot be read, ``journalctl`` fails, or
        the anchors are in syslog and neither ``journalctl`` nor ``journal`` is there.
    """
    folder = Path(log_folder).resolve()
    if anchor != SYSLOG_ANCHOR:
        path = Path(anchor)
        if not path.exists():
            return AnchorSource((), f"anchor file {path} (not there: is its mount?)")
        return _parsed(_read_text(path, "anchor file"), folder, f"anchor file {path}")
    if journal is not None:
        return _parsed(_read_text(Path(journal), "exported journal"), folder,
                       f"exported journal {journal}")
    command = shutil.which("journalctl")
    if command is None:
        raise AnchorError("audit-verify: the anchors are in syslog and journalctl is not on "
                          f"this machine: export them where the log is kept (journalctl -t "
                          f"{ANCHOR_IDENT} -o cat > anchors.txt) and give that file "
                          "(JOURNAL=/abs/anchors.txt)")
    argv = [command, "-t", ANCHOR_IDENT, "-o", "cat", "--no-pager"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=JOURNAL_SECONDS,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AnchorError(f"audit-verify: {' '.join(argv[:5])}: {exc}") from exc
    if done.returncode != 0:
        raise AnchorError(f"audit-verify: {' '.join(argv[:5])} exited {done.returncode}: "
                          f"{done.stderr.strip()[:300]}")
    return _parsed(done.stdout, folder, f"journalctl -t {ANCHOR_IDENT}")
