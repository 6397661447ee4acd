"""The site runtime's side of the audit log: what the hospital's node writes, and when.

The site runner (:mod:`app.site_runtime.site_runner`) appends, to the audit log
of the site's state dir (:mod:`app.site_runtime.audit_log`):

- ``node-start`` when the node starts, with the policy's fingerprint;
- ``policy-change`` whenever the policy in force has another fingerprint than the
  last one audited (an edit by hand between two messages, or by the console);
- ``message``, one per message received, after its reply is pushed
  (:mod:`app.site_runtime.audit_record`);
- ``pacs-sync``, one per sync of the site's PACS cohort (:mod:`app.site_runtime.pacs_sync`):
  counts and bytes only, never an identifier (:meth:`SiteAudit.pacs_sync`);
- ``pacs-store``, one per store of ``make predict``'s results into the PACS (written by
  ``make predict STORE_TO=... STATE=...``, :func:`audit_pacs_store`): counts by kind, bytes
  and the destination's kind, never an identifier.

It anchors the log's head (:mod:`app.site_runtime.audit_anchor`) where the site
policy's ``[audit] anchor`` names: when the node starts, every ``anchor-every``
records and when the node stops (:meth:`SiteAudit.anchor_now`); records the
admin commands append in between count towards the next anchor.

It also keeps ``<state-dir>/audit/node-status.json`` (when it last reached its
SuperNode, the run of the last message) for the console's Overview. Admin
commands (the console, ``make approve-app``, ``make privacy-budget``) audit their
acts with :func:`audit_event`.

A record or an anchor that cannot be written is a loud error in the site's log but
never stops the reply: the federation must not hang on a full disk, and
``make audit-verify`` then reports the gap (the log's hash chain has no hole,
the missing message simply has no record; the site's log says which).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from app.site_runtime.audit_anchor import Anchor, anchor_writer
from app.site_runtime.audit_log import AuditLog, AuditLogError, audit_dir
from clients.site.atomic_file import write_atomic
from clients.site.policy import AuditRules

__all__ = ["STATUS_NAME", "POLICY_SEEN_NAME", "SiteAudit", "audit_event", "audit_pacs_store",
           "audit_policy"]

log = logging.getLogger("fedmed.site_runner")

#: The node's status for the console, in the audit folder.
STATUS_NAME = "node-status.json"
#: The fingerprint of the policy last audited, in the audit folder.
POLICY_SEEN_NAME = "policy-seen.json"
#: Seconds between two writes of the status file while nothing else happens.
STATUS_EVERY = 5.0


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def audit_event(state_dir: str | Path, record: dict[str, Any]) -> dict[str, Any]:
    """Append one admin or node ``record`` (it has a ``kind``) to the site's audit log.

    Raises
    ------
    app.site_runtime.audit_log.AuditLogError
        When the log cannot be written (the caller decides whether that stops it).
    """
    return AuditLog(state_dir).append(record)


def audit_pacs_store(state_dir: str | Path, counts: dict[str, int | str]) -> dict[str, Any]:
    """Append the ``pacs-store`` record of one store of results into the PACS: ``counts``
    (:meth:`clients.pacs.store.StoreReport.counts`) holds numbers and the destination's kind,
    never a UID, a name or a path. Like an admin command's record, it counts towards the next
    anchor the node writes.

    Raises
    ------
    app.site_runtime.audit_log.AuditLogError
        When the log cannot be written.
    """
    return audit_event(state_dir, {"kind": "pacs-store", "by": "predict", **counts})


def audit_policy(state_dir: str | Path, fingerprint: str, by: str) -> bool:
    """Audit a ``policy-change`` if ``fingerprint`` is not the last one audited; True if so.

    Every writer (the runner, the console) goes through here, so one change is
    recorded once, by whoever saw it first.
    """
    seen = audit_dir(state_dir) / POLICY_SEEN_NAME
    previous = None
    if seen.exists():
        try:
            previous = json.loads(seen.read_text(encoding="utf-8")).get("fingerprint")
        except (OSError, ValueError, AttributeError):
            log.warning("audit: %s is unreadable; the policy is audited afresh", seen)
    if previous == fingerprint:
        return False
    audit_event(state_dir, {"kind": "policy-change", "fingerprint": fingerprint,
                            "previous": previous, "by": by})
    write_atomic(seen, lambda handle: handle.write(json.dumps(
        {"fingerprint": fingerprint, "time": _now()}).encode()))
    return True


class SiteAudit:
    """The audit and status writes of one site node.

    Parameters
    ----------
    state_dir : Path
        The site's state dir (the node config's); the log is under ``audit/``.
    site : str
        The site's name.
    anchoring : AuditRules
        The site policy's ``[audit]`` section: where the log's head is anchored and how
        often (default: nowhere); the policy in force replaces it
        (:meth:`policy_in_force`).
    """

    def __init__(self, state_dir: str | Path, site: str,
                 anchoring: AuditRules = AuditRules()) -> None:
        self.state_dir = Path(state_dir)
        self.site = site
        self.anchoring = anchoring
        self.started = _now()
        self.run: int | None = None
        self._written = 0.0
        self._anchored: int | None = None  # the seq this node anchored last

    def node_started(self, fingerprint: str, anchoring: AuditRules | None = None) -> None:
        """Audit the start (and the policy, if it changed since the last record), then
        anchor the head (what the admin commands appended while the node was down too)."""
        self._guarded(lambda: audit_event(self.state_dir, {
            "kind": "node-start", "site": self.site, "policy": fingerprint}))
        self.policy_in_force(fingerprint, anchoring)
        self.anchor_now()
        self.status(reached=False)

    def policy_in_force(self, fingerprint: str, anchoring: AuditRules | None = None) -> None:
        """Audit a ``policy-change`` if the policy's fingerprint is new; ``anchoring``: its
        ``[audit]`` section, in force from the next record on."""
        if anchoring is not None:
            self.anchoring = anchoring
        self._guarded(lambda: audit_policy(self.state_dir, fingerprint, "site-node"))

    def message(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """Append the ``message`` record of one message (and an anchor when one is due:
        ``anchor-every`` records since the last); the record as written (None: not)."""
        self.run = record.get("run", self.run)
        written = self._append(record)
        self.status(reached=True, force=True)
        return written

    def pacs_sync(self, counts: dict[str, int | float | str]) -> dict[str, Any] | None:
        """Append the ``pacs-sync`` record of one cohort sync: ``counts`` holds numbers (and
        the refusing rule, if any), never a study's UID, accession number or a name."""
        return self._append({"kind": "pacs-sync", "site": self.site, **counts})

    def _append(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """Append ``record``, and an anchor when one is due (``anchor-every`` records since
        the last); the record as written (None: not)."""
        written = self._guarded(lambda: audit_event(self.state_dir, record))
        if written is not None and (self._anchored is None or written["seq"] - self._anchored
                                    >= self.anchoring.anchor_every):
            self._anchor(written["seq"], written["hash"])
        return written

    def anchor_now(self) -> Anchor | None:
        """Anchor the log's newest record unless this node anchored it already: at the
        node's start and stop. The anchor written (None: none due, no anchor in the
        policy, or it failed, said loudly in the site's log)."""
        newest = self._guarded(lambda: AuditLog(self.state_dir).newest())
        if newest is None or newest[0] == self._anchored:
            return None
        return self._anchor(*newest)

    def _anchor(self, seq: int, digest: str) -> Anchor | None:
        writer = anchor_writer(self.anchoring.anchor)
        if writer is None:
            return None
        anchor = Anchor(str(audit_dir(self.state_dir).resolve()), self.site, seq, digest,
                        _now())
        try:
            writer.write(anchor)
        except AuditLogError as exc:
            log.error("AUDIT LOG NOT ANCHORED for site %s at seq %d: %s", self.site, seq, exc)
            return None
        self._anchored = seq
        return anchor

    def status(self, reached: bool, force: bool = False) -> None:
        """Write ``node-status.json`` (at most every few seconds unless ``force``)."""
        now = time.monotonic()
        if not force and now - self._written < STATUS_EVERY:
            return
        self._written = now
        status = {"site": self.site, "pid": os.getpid(), "time": _now(),
                  "started": self.started, "runtime_api": "ok" if reached else "unreachable",
                  "run": self.run}
        try:
            write_atomic(audit_dir(self.state_dir) / STATUS_NAME,
                         lambda handle: handle.write(json.dumps(status).encode()))
        except OSError as exc:
            log.error("audit: the node status cannot be written (%s)", type(exc).__name__)

    def _guarded(self, write: Callable[[], Any]) -> Any:
        try:
            return write()
        except (AuditLogError, OSError) as exc:
            log.error("AUDIT LOG NOT WRITTEN for site %s: %s", self.site, exc)
            return None
