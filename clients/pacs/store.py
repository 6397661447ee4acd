"""Results back to the PACS: ``make predict``'s DICOM objects stored by STOW-RS or C-STORE.

The destination is the PACS of a cohort file (:mod:`clients.pacs.cohort`): its
``[pacs.dicomweb]`` section stores by STOW-RS, its ``[pacs.dimse]`` section by C-STORE
from ``calling-aet`` (the connection details live in that one place). Writing into a
PACS needs the site's consent: :func:`check_write_back` refuses, naming the rule
``pacs.write-back``, unless the site policy's ``[pacs]`` section
(:mod:`clients.site.pacs_rules`) sets ``write-back = true`` (default false; a policy
without the section refuses too), and ``pacs.endpoints`` unless it lists the destination.

:func:`store_results` stores each file as one request through the transport's
:func:`~clients.pacs.transport.with_retries` (the cohort's ``[sync]`` back-off). An object
the PACS refuses, or that fails after its retries, gives one line naming its file, and the
others are still stored; a PACS that does not answer at all stops the store with one line
(the objects not sent are counted). Nothing is deleted: every object stays in its folder
(``OUT/dicom``), so a later run can store it again (a PACS keeps one copy per SOP Instance UID).

:meth:`StoreReport.counts` is what the site's audit log keeps of a store: numbers by kind
(``SEG``, ``SR``), bytes and the destination's kind (``dicomweb`` / ``dimse``), never a UID,
a name or a path (``make predict`` appends it, :mod:`app.predict`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import pydicom
from pydicom.errors import InvalidDicomError

from clients.pacs.cohort import Cohort, DicomWebConnection
from clients.pacs.errors import PacsError, Unreachable
from clients.pacs.transport import open_transport
from clients.site.policy import SitePolicy

__all__ = ["StoreReport", "check_write_back", "destination", "object_kind", "store_results"]

logger = logging.getLogger(__name__)


def check_write_back(policy: SitePolicy, cohort: Cohort) -> None:
    """Refuse unless the site policy allows results into ``cohort``'s PACS.

    Raises
    ------
    PolicyRefusal
        One line naming the rule: ``pacs.write-back`` (not true) or ``pacs.endpoints`` (the
        destination is not one the policy lists).
    """
    policy.pacs.check_write_back()
    policy.pacs.check_endpoint(cohort.endpoint)


def destination(cohort: Cohort) -> str:
    """The results destination in words: ``STOW-RS <url>`` or ``C-STORE <aet>@<host>:<port> from <aet>``."""
    link = cohort.connection
    if isinstance(link, DicomWebConnection):
        return f"STOW-RS {cohort.endpoint}"
    return f"C-STORE {cohort.endpoint} from {link.calling_aet}"


def object_kind(path: Path) -> str:
    """``SEG`` or ``SR`` from a result's file name (``<item>.seg.dcm`` / ``<item>.sr.dcm``),
    ``other`` for any other name."""
    kind = Path(path).name.lower().removesuffix(".dcm").rpartition(".")[2]
    return kind.upper() if kind in ("seg", "sr") else "other"


@dataclass
class StoreReport:
    """What one store did: the objects stored, one reason per file not stored, those not sent;
    ``transport``: ``dicomweb`` or ``dimse``; per kind (:func:`object_kind`) the objects stored and
    those not stored (failed or not sent); ``bytes``: the stored files' size."""

    destination: str
    total: int = 0
    stored: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    not_sent: int = 0
    stopped: str = ""
    transport: str = ""
    bytes: int = 0
    stored_by_kind: dict[str, int] = field(default_factory=dict)
    failed_by_kind: dict[str, int] = field(default_factory=dict)

    def counts(self) -> dict[str, int | str]:
        """The store as the audit log keeps it: numbers and the destination's kind only."""
        counts: dict[str, int | str] = {
            "transport": self.transport, "objects": self.total, "stored": self.stored,
            "failed": len(self.failed), "not-sent": self.not_sent, "stored-bytes": self.bytes}
        for kind in sorted({*self.stored_by_kind, *self.failed_by_kind}):
            counts[f"stored-{kind}"] = self.stored_by_kind.get(kind, 0)
            counts[f"not-stored-{kind}"] = self.failed_by_kind.get(kind, 0)
        return counts

    def lines(self) -> list[str]:
        """One line per file not stored, the stop reason (if any), then the summary count."""
        lines = [f"not stored: {reason}" for reason in self.failed.values()]
        if self.stopped:
            lines.append(f"store stopped: {self.stopped}; {self.not_sent} object(s) not sent")
        kept = self.total - self.stored
        lines.append(f"stored {self.stored} of {self.total} DICOM object(s) to {self.destination}"
                     + (f"; {kept} not stored stay in their folder" if kept else ""))
        return lines


def store_results(cohort: Cohort, files: list[Path]) -> StoreReport:
    """Store every file of ``files`` (DICOM Part 10) in the cohort's PACS (module docstring)."""
    web = isinstance(cohort.connection, DicomWebConnection)
    report = StoreReport(destination(cohort), total=len(files),
                         transport="dicomweb" if web else "dimse")
    transport = open_transport(cohort)

    def not_stored(paths: list[Path]) -> None:
        for path in paths:
            kind = object_kind(path)
            report.failed_by_kind[kind] = report.failed_by_kind.get(kind, 0) + 1

    try:
        for k, path in enumerate(files):
            try:
                dataset = pydicom.dcmread(path)
            except (OSError, InvalidDicomError) as exc:
                report.failed[str(path)] = f"{path}: unreadable ({exc})"
                not_stored([path])
                continue
            try:
                transport.store(dataset)
            except PacsError as exc:
                if isinstance(exc.__cause__, Unreachable):
                    report.stopped, report.not_sent = f"{path.name}: {exc}", len(files) - k
                    not_stored(files[k:])
                    break
                report.failed[str(path)] = f"{path}: {exc}"
                not_stored([path])
                continue
            report.stored += 1
            kind = object_kind(path)
            report.stored_by_kind[kind] = report.stored_by_kind.get(kind, 0) + 1
            report.bytes += path.stat().st_size
            logger.info("stored %s (%d/%d)", path.name, k + 1, len(files))
    finally:
        transport.close()
    return report
