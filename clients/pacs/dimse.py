"""DIMSE transport: C-FIND to find, C-GET to fetch, C-STORE to store, with ``pynetdicom``.

Many hospital PACS speak only DIMSE. The sync calls from ``calling-aet`` (the PACS
admin must list it, with C-GET allowed; Orthanc: ``DicomModalities``) and asks the
Study Root information model: C-FIND at STUDY level (``ModalitiesInStudy``,
``StudyDate`` range, ``StudyDescription``, or one query per listed StudyInstanceUID
or AccessionNumber), at SERIES level (``SliceThickness``, ``BodyPartExamined``,
``NumberOfSeriesRelatedInstances``) and at IMAGE level (SOPInstanceUIDs); C-GET
of a whole series, or of the missing instances one by one when a series is resumed.
C-GET returns the instances on the same association (no storage port for the PACS to
reach, unlike C-MOVE), for CT Image Storage in the transfer syntaxes pydicom decodes,
each proposed in a presentation context of its own: a PACS accepts one transfer syntax
per context, so a single context would make it transcode (and fail on a syntax it cannot
transcode, such as JPEG 2000 in Orthanc) instead of sending the instance as it is stored.
A result (a SEG, an SR) is stored by C-STORE on an association of its own, proposing
just the object's SOP class in its own transfer syntax (the PACS admin must allow
``calling-aet`` to store); a failure status refuses that object.

The sync's end of every association acknowledges each TCP segment at once
(``TCP_QUICKACK``, :class:`_QuickAckSocket`): a PACS built on DCMTK with Nagle's algorithm on
(Debian's Orthanc, unless started with ``TCP_NODELAY=1``) sends each C-STORE sub-operation
of a C-GET in two writes and waits for the first one's ACK before the second, which Linux
delays by 40 ms, so a series of 32 slices took 1.6 s instead of 0.2 s.

Each operation opens its own association; one that is not accepted, aborted or that
times out is :class:`~clients.pacs.transport.Transient` (retried); a rejected
association (unknown AE title) or a C-FIND/C-GET failure status is a
:class:`~clients.pacs.errors.PacsError`.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from pydicom.dataset import Dataset
from pydicom.uid import (ExplicitVRLittleEndian, ImplicitVRLittleEndian, JPEG2000, JPEG2000Lossless,
                         JPEGBaseline8Bit, JPEGExtended12Bit, JPEGLosslessSV1, JPEGLSLossless,
                         JPEGLSNearLossless, RLELossless)
from pynetdicom import AE, build_context, build_role, evt
from pynetdicom.association import Association
from pynetdicom.transport import AssociationSocket
from pynetdicom.sop_class import (CTImageStorage, SegmentationStorage,
                                  StudyRootQueryRetrieveInformationModelFind,
                                  StudyRootQueryRetrieveInformationModelGet)

from clients.pacs.cohort import DimseConnection, StudyQuery, SyncOptions
from clients.pacs.errors import PacsError, Unreachable
from clients.pacs.transport import SeriesRecord, StudyRecord, Transient, with_retries

__all__ = ["DimseTransport"]

T = TypeVar("T")
#: The transfer syntaxes the sync accepts a CT image in (all decoded by pydicom's plugins).
_SYNTAXES = [ExplicitVRLittleEndian, ImplicitVRLittleEndian, JPEGBaseline8Bit, JPEGExtended12Bit,
             JPEGLosslessSV1, JPEGLSLossless, JPEGLSNearLossless, JPEG2000Lossless, JPEG2000,
             RLELossless]
_PENDING = (0xFF00, 0xFF01)
_TIMEOUT_S = 30.0


class _QuickAckSocket(AssociationSocket):
    """pynetdicom's association socket that acknowledges what it receives at once.

    Linux clears ``TCP_QUICKACK`` after a while, so it is set again before each read.
    """

    def recv(self, nr_bytes: int) -> bytearray:
        if self.socket is not None:
            self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        return super().recv(nr_bytes)


class _QuickAckAE(AE):
    """An AE whose requested associations use :class:`_QuickAckSocket` (pynetdicom 3.0.4
    creates the socket in ``_create_socket``)."""

    def _create_socket(self, assoc: Association, address: Any, tls_args: Any) -> AssociationSocket:
        sock = _QuickAckSocket(assoc, address=address)
        sock.tls_args = tls_args
        return sock


class DimseTransport:
    """A DIMSE PACS at ``connection.host:port`` with AE title ``connection.called_aet``."""

    def __init__(self, connection: DimseConnection, options: SyncOptions) -> None:
        self.peer, self.options = connection, options
        self.ae = _QuickAckAE(ae_title=connection.calling_aet)
        for timeout in ("acse_timeout", "dimse_timeout", "network_timeout", "connection_timeout"):
            setattr(self.ae, timeout, _TIMEOUT_S)
        self.ae.add_requested_context(StudyRootQueryRetrieveInformationModelFind)
        self.ae.add_requested_context(StudyRootQueryRetrieveInformationModelGet)
        for syntax in _SYNTAXES:  # one context each: the PACS sends every instance as it is stored
            self.ae.add_requested_context(CTImageStorage, syntax)
        for syntax in _SYNTAXES[:2] + [RLELossless]:  # DICOM-SEG labels (labels.source = "seg")
            self.ae.add_requested_context(SegmentationStorage, syntax)
        self.where = f"DIMSE {connection.called_aet}@{connection.host}:{connection.port}"

    def _associate(self, store: Callable[[Any], int] | None = None,
                   sending: Dataset | None = None) -> Association:
        if sending is not None:  # C-STORE of one object: its SOP class and transfer syntax only
            association = self.ae.associate(
                self.peer.host, self.peer.port, ae_title=self.peer.called_aet,
                contexts=[build_context(sending.SOPClassUID, sending.file_meta.TransferSyntaxUID)])
        else:
            handlers = [] if store is None else [(evt.EVT_C_STORE, store)]
            association = self.ae.associate(self.peer.host, self.peer.port, ae_title=self.peer.called_aet,
                                            ext_neg=[build_role(CTImageStorage, scp_role=True),
                                                     build_role(SegmentationStorage, scp_role=True)],
                                            evt_handlers=handlers)
        if association.is_rejected:
            raise PacsError(f"{self.where} rejected the association from AE title "
                            f"{self.peer.calling_aet} (not allowed by the PACS?)")
        if not association.is_established:
            raise Unreachable("association not established (PACS down or unreachable)")
        return association

    def _run(self, operation: Callable[[Association], T], what: str,
             store: Callable[[Any], int] | None = None, sending: Dataset | None = None) -> T:
        def attempt() -> T:
            association = self._associate(store, sending)
            try:
                result = operation(association)
            finally:
                aborted = association.is_aborted
                association.release()
            if aborted:
                raise Transient("association aborted")
            return result
        return with_retries(attempt, self.options, f"{self.where} {what}")

    def _find(self, identifier: Dataset, what: str) -> list[Dataset]:
        def find(association: Association) -> list[Dataset]:
            answers = []
            for status, found in association.send_c_find(
                    identifier, StudyRootQueryRetrieveInformationModelFind):
                if not status:
                    raise Transient("no C-FIND response (timeout)")
                if status.Status in _PENDING and found is not None:
                    answers.append(found)
                elif status.Status != 0x0000:
                    raise PacsError(f"{self.where} {what}: C-FIND status 0x{status.Status:04X}"
                                    f"{' (AE title not allowed to query?)' if status.Status == 0xA700 or status.Status >= 0xC000 else ''}")
            return answers
        return self._run(find, what)

    def find_studies(self, query: StudyQuery) -> list[StudyRecord]:
        """C-FIND at STUDY level (one query per listed UID or accession)."""
        base = _identifier("STUDY", StudyInstanceUID="", AccessionNumber="",
                           ModalitiesInStudy=query.modality, StudyDescription=query.study_description,
                           StudyDate=query.date_range)
        searches = ([_with(base, StudyInstanceUID=uid) for uid in query.study_instance_uids]
                    + [_with(base, AccessionNumber=acc) for acc in query.accession_numbers] or [base])
        found: dict[str, StudyRecord] = {}
        for identifier in searches:
            for answer in self._find(identifier, "C-FIND studies"):
                uid = str(answer.StudyInstanceUID)
                found[uid] = StudyRecord(uid, str(answer.get("AccessionNumber", "") or ""))
        return list(found.values())

    def find_series(self, study_uid: str, modality: str) -> list[SeriesRecord]:
        """C-FIND at SERIES level: the series of ``modality`` with their slice thickness."""
        identifier = _identifier("SERIES", StudyInstanceUID=study_uid, SeriesInstanceUID="",
                                 Modality=modality, SeriesDescription="", BodyPartExamined="",
                                 SliceThickness="", NumberOfSeriesRelatedInstances="")
        records = []
        for answer in self._find(identifier, "C-FIND series"):
            thickness = answer.get("SliceThickness", None)
            records.append(SeriesRecord(
                str(answer.SeriesInstanceUID), str(answer.get("Modality", "")),
                str(answer.get("SeriesDescription", "") or ""), str(answer.get("BodyPartExamined", "") or ""),
                float(thickness) if thickness not in (None, "") else None,
                int(answer.get("NumberOfSeriesRelatedInstances", 0) or 0)))
        return records

    def instance_uids(self, study_uid: str, series_uid: str) -> list[str]:
        """C-FIND at IMAGE level: the SOPInstanceUIDs of a series."""
        identifier = _identifier("IMAGE", StudyInstanceUID=study_uid, SeriesInstanceUID=series_uid,
                                 SOPInstanceUID="")
        return [str(answer.SOPInstanceUID) for answer in self._find(identifier, "C-FIND instances")]

    def fetch(self, study_uid: str, series_uid: str, sop_uids: Iterable[str] | None,
              store: Callable[[bytes], None]) -> None:
        """C-GET of the whole series, or of ``sop_uids`` one by one; each instance handed to
        ``store`` as the Part 10 bytes the PACS sent."""
        identifiers = ([_identifier("SERIES", StudyInstanceUID=study_uid, SeriesInstanceUID=series_uid)]
                       if sop_uids is None else
                       [_identifier("IMAGE", StudyInstanceUID=study_uid, SeriesInstanceUID=series_uid,
                                    SOPInstanceUID=uid) for uid in sop_uids])

        handler = _StoreHandler(store)

        def get(association: Association) -> None:
            for identifier in identifiers:
                for status, _ in _responses(association, identifier):
                    handler.raise_failure()
                    if not status:
                        raise Transient("no C-GET response (timeout)")
                    if status.Status not in (0x0000, *_PENDING):
                        raise PacsError(f"{self.where} C-GET: status 0x{status.Status:04X}")
            handler.raise_failure()
        self._run(get, "C-GET", handler)

    def store(self, dataset: Dataset) -> None:
        """C-STORE of one object (a warning status is stored; a failure refuses it)."""
        def send(association: Association) -> None:
            if not association.accepted_contexts:
                raise PacsError(f"{self.where} C-STORE: the PACS accepts no {dataset.SOPClassUID.name} "
                                f"in {dataset.file_meta.TransferSyntaxUID.name}")
            status = association.send_c_store(dataset)
            if not status:
                raise Transient("no C-STORE response (timeout)")
            if status.Status != 0x0000 and not 0xB000 <= status.Status <= 0xBFFF:
                raise PacsError(f"{self.where} C-STORE refused {dataset.SOPInstanceUID}: "
                                f"status 0x{status.Status:04X}")
        self._run(send, "C-STORE", sending=dataset)

    def close(self) -> None:
        """Nothing held between operations (each opens its own association)."""


def _responses(association: Association, identifier: Dataset) -> Iterator[tuple[Any, Any]]:
    return association.send_c_get(identifier, StudyRootQueryRetrieveInformationModelGet)


class _StoreHandler:
    """The C-STORE sub-operations of a C-GET: each instance handed to ``store`` as the Part 10
    bytes the PACS sent (``Event.encoded_dataset``: not decoded and re-encoded).

    What ``store`` raises (a full disk, an interruption) cannot cross pynetdicom's event
    thread: it is kept, the sub-operation answered "out of resources" (0xA700), and
    :meth:`raise_failure` raises it in the caller's thread as it was.
    """

    def __init__(self, store: Callable[[bytes], None]) -> None:
        self.store, self.failure = store, None  # type: BaseException | None

    def __call__(self, event: Any) -> int:
        if self.failure is not None:
            return 0xA700
        try:
            self.store(event.encoded_dataset(include_meta=True))
        except BaseException as exc:  # re-raised by raise_failure in the sync's thread
            self.failure = exc
            return 0xA700
        return 0x0000

    def raise_failure(self) -> None:
        """Raise what ``store`` raised, if it did."""
        if self.failure is not None:
            raise self.failure


def _identifier(level: str, **elements: str) -> Dataset:
    identifier = Dataset()
    identifier.QueryRetrieveLevel = level
    for keyword, value in elements.items():
        setattr(identifier, keyword, value)
    return identifier


def _with(identifier: Dataset, **elements: str) -> Dataset:
    copy = Dataset(identifier)
    for keyword, value in elements.items():
        setattr(copy, keyword, value)
    return copy
