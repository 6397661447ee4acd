"""What the product asks of a PACS, whatever it speaks: find studies, their series, fetch
instances, and store results back.

A transport is a :class:`PacsTransport` (``find_studies``, ``find_series``,
``instance_uids``, ``fetch`` for the sync (each instance as the Part 10 bytes the PACS
sent: the sync writes them as they are and parses them once); ``store`` for :mod:`clients.pacs.store`, STOW-RS or
C-STORE of one DICOM object); :data:`TRANSPORTS`, the one registry of them, maps the
cohort file's ``[pacs.<name>]`` section to its class, imported on use:
``dicomweb`` (:mod:`clients.pacs.dicomweb`, QIDO-RS + WADO-RS + STOW-RS with dicomweb-client)
and ``dimse`` (:mod:`clients.pacs.dimse`, C-FIND + C-GET + C-STORE with pynetdicom).

Every request goes through :func:`with_retries`: a :class:`Transient` failure (refused
or reset connection, timeout, HTTP 5xx, a DIMSE association that did not come up) is
retried with exponential back-off (``backoff-s``, doubled each time, ``retries`` times),
then raised as :class:`~clients.pacs.errors.PacsError` (from the last failure; a PACS that
never answered is an :class:`~clients.pacs.errors.Unreachable` one); a refusal (HTTP 401/403, an AE
title the PACS does not know) is a :class:`~clients.pacs.errors.PacsError` at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from pydicom.dataset import Dataset

from clients.pacs.cohort import Cohort, StudyQuery, SyncOptions
from clients.pacs.errors import PacsError, Transient
from strategies.wire.registry import Registry

__all__ = ["StudyRecord", "SeriesRecord", "PacsTransport", "Transient", "with_retries",
           "TRANSPORTS", "open_transport"]

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class StudyRecord:
    """A study the PACS answered: its StudyInstanceUID and AccessionNumber ("" when empty)."""

    study_uid: str
    accession: str


@dataclass(frozen=True)
class SeriesRecord:
    """A series of a study: UID, modality, description, body part, slice thickness, instances."""

    series_uid: str
    modality: str
    description: str
    body_part: str
    thickness_mm: float | None
    instances: int


class PacsTransport(Protocol):
    """One connection to a PACS (closed by :meth:`close`)."""

    def find_studies(self, query: StudyQuery) -> list[StudyRecord]:
        """The studies matching ``query`` (study level)."""
        ...

    def find_series(self, study_uid: str, modality: str) -> list[SeriesRecord]:
        """The series of ``study_uid`` of ``modality``."""
        ...

    def instance_uids(self, study_uid: str, series_uid: str) -> list[str]:
        """The SOPInstanceUIDs of a series."""
        ...

    def fetch(self, study_uid: str, series_uid: str, sop_uids: Iterable[str] | None,
              store: Callable[[bytes], None]) -> None:
        """Hand every instance of the series (only ``sop_uids`` when given) to ``store``, as
        the DICOM Part 10 file the PACS sent (bytes, never decoded and re-encoded on the way)."""
        ...

    def store(self, dataset: Dataset) -> None:
        """Store one DICOM object in the PACS (STOW-RS, C-STORE); a refusal is a PacsError."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


def with_retries(call: Callable[[], T], options: SyncOptions, what: str) -> T:
    """``call()``, retried on :class:`Transient` with exponential back-off.

    Raises
    ------
    PacsError
        ``<what>: <reason> (after N attempts)`` once the retries are spent.
    """
    delay = options.backoff_s
    for attempt in range(options.retries + 1):
        try:
            return call()
        except Transient as exc:
            if attempt == options.retries:
                raise PacsError(f"{what}: {exc} (after {attempt + 1} attempts)") from exc
            logger.warning("PACS %s failed (%s); retrying in %.1f s", what, exc, delay)
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


#: The transports by the name of their cohort-file section (``[pacs.<name>]``).
TRANSPORTS: Registry[type] = Registry("PACS transport", "pacs")
TRANSPORTS.add_path("dicomweb", "clients.pacs.dicomweb:DicomWebTransport")
TRANSPORTS.add_path("dimse", "clients.pacs.dimse:DimseTransport")


def open_transport(cohort: Cohort) -> PacsTransport:
    """A connected transport for the cohort's PACS section."""
    return TRANSPORTS.get(cohort.transport)(cohort.connection, cohort.sync)
