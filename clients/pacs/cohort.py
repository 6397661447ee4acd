"""The cohort file: which studies of the hospital's PACS form a site's dataset.

A site declares, instead of a folder, a TOML cohort file. Every relative path in
it is relative to the file's own folder. Keys are kebab-case, like the site policy::

    name = "pe-2024"                  # the local store's folder name (A-Z a-z 0-9 _ . -)
    task = "pe-seg"                   # the task whose site folder the sync writes

    [pacs.dicomweb]                   # DICOMweb (QIDO-RS, WADO-RS) ...
    url = "http://127.0.0.1:8042/dicom-web"
    credentials = "pacs-credentials.toml"   # username = "...", password = "..." (mode 0600)

    [pacs.dimse]                      # ... or DIMSE (C-FIND, C-GET): exactly one of the two
    called-aet = "HOSPITAL00"         # the PACS's AE title
    host = "127.0.0.1"
    port = 4242
    calling-aet = "FEDMED"            # the AE title the PACS admin allowed for the sync

    [query]                           # which studies: filters ...
    modality = "CT"                   # ModalitiesInStudy (default "CT")
    body-part = "CHEST"               # BodyPartExamined of the series (optional)
    study-description = "*CTPA*"      # StudyDescription, DICOM wildcards * ? (optional)
    date-from = 2024-01-01            # StudyDate range, inclusive (optional, TOML dates)
    date-to = 2024-12-31
    # ... or an explicit list (then only modality and body-part filter further):
    # study-instance-uids = ["1.2.826...", ...]   or   accession-numbers = ["A123", ...]

    [series]                          # which series of a study (explicit, never a guess)
    description = "*"                 # SeriesDescription wildcard the series must match
    choose = "thinnest"               # several match: the thinnest slices ("single": skip)

    [labels]                          # where the labels come from
    source = "csv"                    # "csv": the CSV names each mask; "seg": the DICOM-SEG
                                      # in the PACS that references the chosen CT series
    csv = "labels.csv"                # the label CSV (with source = "seg": the split CSV)
    key = "study-instance-uid"        # or "accession-number": the CSV's first column
    segment = "Pulmonary embolism"    # source = "seg": the Segment Label to take (optional
                                      # when each SEG holds one segment)

    [sync]
    retries = 4                       # attempts after the first, per request
    backoff-s = 0.5                   # first back-off; doubled after each failure
    parallel = 4                      # studies fetched at a time, each on its own connection

The label CSV has the header ``<key>,split,mask`` and an optional fourth column
``study_id``: the key column is ``study_instance_uid`` or ``accession_number``,
``split`` is ``train``/``val``/``test``, ``mask`` the study's NIfTI mask (relative to
the CSV's folder) and ``study_id`` the site-unique id the manifest uses (default:
``study-`` + 12 hex digits of the SHA-256 of the StudyInstanceUID).

With ``source = "seg"`` the masks are in the PACS, as DICOM-SEG objects referencing the
series (:mod:`clients.pacs.seg_labels`: the SEG of the chosen CT series, its one segment
or the one labelled ``segment``), and the CSV is the same file without its ``mask``
column, ``<key>,split[,study_id]``: which studies are in the cohort and in which split
stays the hospital's explicit choice (a test set is never drawn by the sync), as it is
the list a research office keeps. A study the query finds but the CSV does not list is
skipped ("missing label").

Every check is eager: :func:`load_cohort` reads the file, its credentials and its
label CSV, and raises :class:`~clients.pacs.errors.CohortError` naming the file and
the key (or the CSV line) before any PACS is contacted.
"""

from __future__ import annotations

import csv
import datetime as dt
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clients.manifests.csv_rows import SPLITS
from clients.pacs.errors import CohortError

__all__ = ["DicomWebConnection", "DimseConnection", "StudyQuery", "SeriesRule", "LabelRow",
           "Labels", "SyncOptions", "Cohort", "load_cohort", "LABEL_KEYS"]

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_AET = re.compile(r"[\x20-\x5b\x5d-\x7e]{1,16}")  # printable, no backslash (PS3.5 AE VR)
#: The cohort's ``labels.key`` -> the label CSV's key column.
LABEL_KEYS = {"study-instance-uid": "study_instance_uid", "accession-number": "accession_number"}
_CHOICES = ("thinnest", "single")
_SOURCES = ("csv", "seg")


@dataclass(frozen=True)
class DicomWebConnection:
    """A DICOMweb endpoint: its base URL and HTTP basic credentials (read from their file)."""

    url: str
    username: str = field(repr=False)
    password: str = field(repr=False)


@dataclass(frozen=True)
class DimseConnection:
    """A DIMSE peer: its AE title, host and port, and the AE title the sync calls from."""

    called_aet: str
    host: str
    port: int
    calling_aet: str


@dataclass(frozen=True)
class StudyQuery:
    """Which studies: filters, or an explicit list of StudyInstanceUIDs or accession numbers."""

    modality: str = "CT"
    body_part: str = ""
    study_description: str = ""
    date_from: dt.date | None = None
    date_to: dt.date | None = None
    study_instance_uids: tuple[str, ...] = ()
    accession_numbers: tuple[str, ...] = ()

    @property
    def date_range(self) -> str:
        """The DICOM StudyDate range matcher (``YYYYMMDD-YYYYMMDD``, open ends allowed), or ""."""
        if self.date_from is None and self.date_to is None:
            return ""
        low = self.date_from.strftime("%Y%m%d") if self.date_from else ""
        high = self.date_to.strftime("%Y%m%d") if self.date_to else ""
        return f"{low}-{high}"


@dataclass(frozen=True)
class SeriesRule:
    """How a study's series is chosen: the CT series matching ``description``; of several,
    the thinnest slices (``choose = "thinnest"``) or none (``"single"``: the study is skipped)."""

    description: str = "*"
    choose: str = "thinnest"


@dataclass(frozen=True)
class LabelRow:
    """One label CSV row: the study's key, split, mask file (None: the SEG in the PACS) and
    site-unique study id (or "")."""

    key: str
    split: str
    mask: Path | None
    study_id: str
    line: int


@dataclass(frozen=True)
class Labels:
    """The label source: a CSV keyed by ``key`` (``study_instance_uid`` or ``accession_number``);
    ``source`` ``"csv"`` (its masks) or ``"seg"`` (DICOM-SEG in the PACS, ``segment``: the
    Segment Label to take, "" for a SEG's one segment)."""

    csv: Path
    key: str
    rows: dict[str, LabelRow]
    source: str = "csv"
    segment: str = ""


@dataclass(frozen=True)
class SyncOptions:
    """Retries per request and the first back-off (s), doubled after each failure; the
    studies fetched at a time (each on its own connection)."""

    retries: int = 4
    backoff_s: float = 0.5
    parallel: int = 4


@dataclass(frozen=True)
class Cohort:
    """A parsed cohort file (:func:`load_cohort`)."""

    path: Path
    name: str
    task: str
    transport: str
    connection: DicomWebConnection | DimseConnection
    query: StudyQuery
    series: SeriesRule
    labels: Labels
    sync: SyncOptions

    @property
    def endpoint(self) -> str:
        """The PACS as the site policy's ``[pacs] endpoints`` names it: the DICOMweb base URL,
        or ``AET@host:port`` of the DIMSE peer (:mod:`clients.site.pacs_rules`)."""
        link = self.connection
        if isinstance(link, DicomWebConnection):
            return link.url
        return f"{link.called_aet}@{link.host}:{link.port}"


class _Table:
    """One TOML table of the cohort file: typed getters whose errors name the file and key."""

    def __init__(self, path: Path, table: Any, prefix: str) -> None:
        self.path, self.prefix = path, prefix
        if not isinstance(table, dict):
            self.fail("", "must be a table")
        self.table: dict[str, Any] = table

    def fail(self, key: str, reason: str) -> None:
        name = f"{self.prefix}{key}".rstrip(".") or "(top level)"
        raise CohortError(f"cohort file {self.path}: key '{name}' {reason}")

    def only(self, *known: str) -> None:
        for key in self.table:
            if key not in known:
                self.fail(key, f"is not a cohort key here (known: {', '.join(known)})")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        value = self.table.get(key, default)
        if value is None:
            self.fail(key, "is missing")
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            self.fail(key, f"must be {getattr(kind, '__name__', kind)}, got {value!r}")
        return value

    def text(self, key: str, default: str | None = None, pattern: re.Pattern | None = None) -> str:
        value = self.get(key, str, default)
        if pattern is not None and not pattern.fullmatch(value):
            self.fail(key, f"{value!r} does not match {pattern.pattern}")
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.get(key, list, [])
        if not all(isinstance(v, str) and v for v in value):
            self.fail(key, "must be a list of non-empty strings")
        return tuple(value)

    def file(self, key: str) -> Path:
        path = self.path.parent / self.text(key)
        if not path.is_file():
            self.fail(key, f"names {path}, which is not a file")
        return path

    def sub(self, key: str) -> _Table:
        return _Table(self.path, self.table.get(key, {}), f"{self.prefix}{key}.")


def _credentials(table: _Table) -> tuple[str, str]:
    path = table.file("credentials")
    try:
        values = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        table.fail("credentials", f"names {path}, not a readable TOML file ({exc})")
    secret = _Table(path, values, "")
    secret.only("username", "password")
    return secret.text("username"), secret.text("password")


def _connection(pacs: _Table) -> tuple[str, DicomWebConnection | DimseConnection]:
    pacs.only("dicomweb", "dimse")
    if len(pacs.table) != 1:
        pacs.fail("", "must hold exactly one of [pacs.dicomweb] and [pacs.dimse]")
    if "dicomweb" in pacs.table:
        web = pacs.sub("dicomweb")
        web.only("url", "credentials")
        url = web.text("url")
        if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
            web.fail("url", f"must be an http(s) URL, got {url!r}")
        return "dicomweb", DicomWebConnection(url.rstrip("/"), *_credentials(web))
    dimse = pacs.sub("dimse")
    dimse.only("called-aet", "host", "port", "calling-aet")
    port = dimse.get("port", int)
    if not 0 < port < 65536:
        dimse.fail("port", f"must be a TCP port, got {port}")
    return "dimse", DimseConnection(dimse.text("called-aet", pattern=_AET), dimse.text("host"), port,
                                    dimse.text("calling-aet", "FEDMED", pattern=_AET))


def _query(table: _Table) -> StudyQuery:
    table.only("modality", "body-part", "study-description", "date-from", "date-to",
               "study-instance-uids", "accession-numbers")
    dates = [table.get(key, dt.date, dt.date.min) for key in ("date-from", "date-to")]
    low, high = (None if d == dt.date.min else d for d in dates)
    if low and high and low > high:
        table.fail("date-from", f"{low} is after date-to {high}")
    query = StudyQuery(table.text("modality", "CT"), table.text("body-part", ""),
                       table.text("study-description", ""), low, high,
                       table.strings("study-instance-uids"), table.strings("accession-numbers"))
    if query.study_instance_uids and query.accession_numbers:
        table.fail("study-instance-uids", "and accession-numbers exclude each other")
    if (query.study_instance_uids or query.accession_numbers) and (
            query.study_description or query.date_range):
        table.fail("study-description", "and date-from/date-to do not go with an explicit list")
    return query


def _labels(table: _Table) -> Labels:
    table.only("source", "csv", "key", "segment")
    source = table.text("source", "csv")
    if source not in _SOURCES:
        table.fail("source", f"must be one of {', '.join(_SOURCES)}, got {source!r}")
    segment = table.text("segment", "")
    if segment and source != "seg":
        table.fail("segment", "goes only with source = 'seg'")
    key = table.text("key", "study-instance-uid")
    if key not in LABEL_KEYS:
        table.fail("key", f"must be one of {', '.join(LABEL_KEYS)}, got {key!r}")
    path = table.file("csv")
    return Labels(path, LABEL_KEYS[key], read_labels(path, LABEL_KEYS[key], masks=source == "csv"),
                  source, segment)


def read_labels(path: Path, key: str, masks: bool = True) -> dict[str, LabelRow]:
    """The rows of a label CSV by key (``masks``: with its ``mask`` column, else the split
    CSV of ``source = "seg"``); errors name the file and the line."""
    def fail(line: int, reason: str) -> None:
        raise CohortError(f"label CSV {path}, line {line}: {reason}")

    try:
        with open(path, newline="", encoding="utf-8") as handle:
            lines = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError) as exc:
        raise CohortError(f"label CSV {path}: unreadable ({exc})") from exc
    header = [name.strip() for name in lines[0]] if lines else []
    columns = [key, "split", "mask"] if masks else [key, "split"]
    if header not in (columns, [*columns, "study_id"]):
        fail(1, f"header must be '{','.join(columns)}[,study_id]', got {','.join(header)!r}")
    rows: dict[str, LabelRow] = {}
    for number, values in enumerate(lines[1:], start=2):
        if not values:
            continue
        if len(values) != len(header):
            fail(number, f"{len(values)} fields, expected {len(header)}")
        value, split, *rest = (v.strip() for v in values)
        mask = rest.pop(0) if masks else None
        if not value or mask == "":
            fail(number, f"empty {key if not value else 'mask'}")
        if split not in SPLITS:
            fail(number, f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        if value in rows:
            fail(number, f"{key} {value} already on line {rows[value].line}")
        study_id = rest[0] if rest else ""
        if study_id and not _NAME.fullmatch(study_id):
            fail(number, f"study_id {study_id!r} must match {_NAME.pattern}")
        rows[value] = LabelRow(value, split, None if mask is None else path.parent / mask,
                               study_id, number)
    ids = [row.study_id for row in rows.values() if row.study_id]
    if len(ids) != len(set(ids)):
        fail(1, "a study_id appears twice")
    return rows


def load_cohort(path: Path) -> Cohort:
    """Read and check a cohort file (see the module docstring), its credentials and label CSV.

    Raises
    ------
    CohortError
        Naming the file and the key (or the label CSV's line) of the first problem.
    """
    path = Path(path).resolve()
    try:
        values = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise CohortError(f"cohort file {path}: unreadable ({exc})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise CohortError(f"cohort file {path}: not valid TOML ({exc})") from exc
    top = _Table(path, values, "")
    top.only("name", "task", "pacs", "query", "series", "labels", "sync")
    if "pacs" not in values:
        top.fail("pacs", "is missing ([pacs.dicomweb] or [pacs.dimse])")
    transport, connection = _connection(top.sub("pacs"))
    series = top.sub("series")
    series.only("description", "choose")
    rule = SeriesRule(series.text("description", "*"), series.text("choose", "thinnest"))
    if rule.choose not in _CHOICES:
        series.fail("choose", f"must be one of {', '.join(_CHOICES)}, got {rule.choose!r}")
    sync = top.sub("sync")
    sync.only("retries", "backoff-s", "parallel")
    options = SyncOptions(sync.get("retries", int, 4), float(sync.get("backoff-s", (int, float), 0.5)),
                          sync.get("parallel", int, 4))
    if options.retries < 0 or options.backoff_s < 0:
        sync.fail("retries", "and backoff-s must be >= 0")
    if not 1 <= options.parallel <= 32:
        sync.fail("parallel", f"must be 1 to 32 studies at a time, got {options.parallel}")
    task = top.text("task", "pe-seg")
    if task != "pe-seg":
        top.fail("task", f"must be 'pe-seg' (the one task with a PACS sync so far), got {task!r}")
    return Cohort(path, top.text("name", pattern=_NAME), task, transport, connection,
                  _query(top.sub("query")), rule, _labels(top.sub("labels")), options)
