"""DICOMweb transport: QIDO-RS to find, WADO-RS to fetch, STOW-RS to store, with ``dicomweb-client``.

Studies are searched at study level (``ModalitiesInStudy``, ``StudyDate`` range,
``StudyDescription`` wildcard, or one search per listed StudyInstanceUID or
AccessionNumber), series at series level with ``SliceThickness`` included, instances
by UID. A whole series is fetched as one WADO-RS multipart stream, each part handed to the
sync as the Part 10 bytes it holds (written as they are, parsed once by the sync); a
resumed series fetches only its missing instances.
Instances are asked for in the PACS's own transfer syntax (``transfer-syntax=*``), so
nothing is transcoded on the way; compressed ones are decoded later by pydicom's
maintained plugins (pylibjpeg).
A result is stored one object per STOW-RS request (``POST {url}/studies``); an answer
listing it in the FailedSOPSequence (0008,1198), or an HTTP 4xx, refuses that object.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import requests
from dicomweb_client import DICOMwebClient
from dicomweb_client.session_utils import create_session_from_user_pass
from pydicom.dataset import Dataset

from clients.pacs.cohort import DicomWebConnection, StudyQuery, SyncOptions
from clients.pacs.errors import PacsError, Unreachable
from clients.pacs.transport import SeriesRecord, StudyRecord, Transient, with_retries

__all__ = ["DicomWebTransport"]

T = TypeVar("T")
#: Ask for every instance as it is stored (no transcoding by the PACS).
_ACCEPT_AS_STORED = 'multipart/related; type="application/dicom"; transfer-syntax=*'
_TIMEOUT_S = 30.0


def _value(item: dict[str, Any], tag: str, default: Any = "") -> Any:
    """The first value of a DICOM JSON attribute (PS3.18 F.2), or ``default``."""
    values = item.get(tag, {}).get("Value") or [default]
    return values[0]


class DicomWebTransport:
    """A DICOMweb PACS at ``connection.url`` with HTTP basic credentials."""

    def __init__(self, connection: DicomWebConnection, options: SyncOptions) -> None:
        self.url, self.options = connection.url, options
        session = create_session_from_user_pass(connection.username, connection.password)
        session.request = _with_timeout(session.request)  # type: ignore[method-assign]
        self.session = session
        self.client = DICOMwebClient(connection.url, session=session, timeout=_TIMEOUT_S)
        self.client.set_http_retry_params(retry=False)  # one back-off policy: the cohort's [sync]

    def _call(self, call: Callable[[], T], what: str) -> T:
        def attempt() -> T:
            try:
                return call()
            except requests.ConnectionError as exc:
                raise Unreachable(f"{type(exc).__name__}") from exc
            except (requests.Timeout, requests.exceptions.ChunkedEncodingError) as exc:
                raise Transient(f"{type(exc).__name__}") from exc
            except requests.HTTPError as exc:
                status = exc.response.status_code if exc.response is not None else 0
                if status >= 500:
                    raise Transient(f"HTTP {status}") from exc
                hint = " (wrong credentials?)" if status in (401, 403) else ""
                raise PacsError(f"DICOMweb {self.url} {what}: HTTP {status}{hint}") from exc
        return with_retries(attempt, self.options, f"DICOMweb {self.url} {what}")

    def find_studies(self, query: StudyQuery) -> list[StudyRecord]:
        """QIDO-RS studies matching ``query`` (one search per listed UID or accession)."""
        base = {"ModalitiesInStudy": query.modality}
        if query.study_description:
            base["StudyDescription"] = query.study_description
        if query.date_range:
            base["StudyDate"] = query.date_range
        searches = ([{**base, "StudyInstanceUID": uid} for uid in query.study_instance_uids]
                    + [{**base, "AccessionNumber": acc} for acc in query.accession_numbers]
                    or [base])
        found: dict[str, StudyRecord] = {}
        for filters in searches:
            answer = self._call(lambda f=filters: self.client.search_for_studies(
                search_filters=f, fields=["AccessionNumber"]), "QIDO studies")
            for item in answer:
                uid = _value(item, "0020000D")
                found[uid] = StudyRecord(uid, str(_value(item, "00080050")))
        return list(found.values())

    def find_series(self, study_uid: str, modality: str) -> list[SeriesRecord]:
        """QIDO-RS series of a study of ``modality``, with their slice thickness."""
        answer = self._call(lambda: self.client.search_for_series(
            study_uid, search_filters={"Modality": modality},
            fields=["SliceThickness", "BodyPartExamined", "SeriesDescription",
                    "NumberOfSeriesRelatedInstances"]), "QIDO series")
        records = []
        for item in answer:
            thickness = _value(item, "00180050", None)
            records.append(SeriesRecord(
                _value(item, "0020000E"), str(_value(item, "00080060")), str(_value(item, "0008103E")),
                str(_value(item, "00180015")), None if thickness is None else float(thickness),
                int(_value(item, "00201209", 0))))
        return records

    def instance_uids(self, study_uid: str, series_uid: str) -> list[str]:
        """QIDO-RS: the SOPInstanceUIDs of a series."""
        answer = self._call(lambda: self.client.search_for_instances(
            study_uid, series_uid), "QIDO instances")
        return [_value(item, "00080018") for item in answer]

    def fetch(self, study_uid: str, series_uid: str, sop_uids: Iterable[str] | None,
              store: Callable[[bytes], None]) -> None:
        """WADO-RS: the whole series as one multipart stream, or only ``sop_uids`` one by one;
        each part handed to ``store`` as the Part 10 bytes it holds."""
        series = f"{self.url}/studies/{study_uid}/series/{series_uid}"
        urls = [series] if sop_uids is None else [f"{series}/instances/{uid}" for uid in sop_uids]
        for url in urls:
            self._call(lambda u=url: self._parts(u, store), "WADO series" if sop_uids is None
                       else "WADO instance")

    def _parts(self, url: str, store: Callable[[bytes], None]) -> None:
        """GET ``url`` as ``multipart/related; type="application/dicom"``, streamed, and hand
        each part to ``store``. The parts are split by dicomweb-client's own multipart decoder
        (``DICOMwebClient._decode_multipart_message``, pinned 0.61.2), which its
        ``iter_series`` uses before it parses each part: the bytes are kept as they are."""
        response = self.session.get(url, headers={"Accept": _ACCEPT_AS_STORED}, stream=True,
                                    timeout=_TIMEOUT_S)
        response.raise_for_status()
        if response.headers.get("Content-Type", "").startswith("application/dicom"):
            store(response.content)  # a server that sends one part unencapsulated
            return
        for part in self.client._decode_multipart_message(response, stream=True):
            store(bytes(part))

    def store(self, dataset: Dataset) -> None:
        """STOW-RS of one object; refused when the answer lists it as failed."""
        answer = self._call(lambda: self.client.store_instances([dataset]), "STOW-RS")
        for failed in answer.get("FailedSOPSequence", []):
            sop, reason = failed.get("ReferencedSOPInstanceUID", ""), failed.get("FailureReason", "")
            raise PacsError(f"DICOMweb {self.url} STOW-RS refused {sop}"
                            + (f": failure reason 0x{int(reason):04X}" if reason != "" else ""))

    def close(self) -> None:
        """Close the HTTP session."""
        self.session.close()


def _with_timeout(request: Callable[..., Any]) -> Callable[..., Any]:
    """``requests.Session.request`` with a default timeout (for a call that sets none; the
    client's own requests get ``_TIMEOUT_S`` from its ``timeout``)."""
    def bounded(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("timeout", _TIMEOUT_S)
        return request(*args, **kwargs)
    return bounded
