"""The PACS sync: a cohort's studies fetched once into the site's local store, a site folder.

:func:`sync_cohort` turns a cohort file (:mod:`clients.pacs.cohort`) into the site
folder the pe-seg loader already reads (:func:`clients.pe_seg.data.load_site`), under
the site's state folder, mode 0700::

    <state-dir>/pacs/<cohort name>/        0700: the site folder of the cohort
        manifest.csv                       study_id,split,image,mask (clients.pe_seg.manifest)
        series/<hash of SeriesUID>/<hash of SOPInstanceUID>   one DICOM file per instance
        masks/<study_id>.nii.gz            the label CSV's mask, copied in, or the mask of the
                                           study's DICOM-SEG (labels.source = "seg")
        pacs-index.json                    per study: key, study_id, series, instances, state
        pacs-report.json                   the last sync: counts, bytes, MB/s, skipped reasons

So nothing else in the product changes: ``data-path`` is that folder.

The sync is

- **incremental**: a study the index holds as complete is not asked for again; a study
  no longer in the cohort (the query's answer or the explicit list) leaves the index, the
  manifest and the store;
- **resumable**: every instance is written atomically as it arrives, as the bytes the PACS
  sent, and the index after every study, so an interrupted sync leaves complete files only;
  the next sync fetches just the instances a study still lacks (a series folder no index
  entry names, of a study that has since left the cohort, is removed);
- **parallel**: ``[sync] parallel`` studies (default 4) are fetched at a time, each thread
  on its own connection; the index, the report and the progress are kept by the caller's
  thread, and a failure other than a skip stops the others at their next instance;
- **explicit in its series choice**: the series of the query's modality whose
  description matches ``series.description`` (DICOM wildcards) and whose body part is
  ``query.body-part`` (when set); of several, the thinnest slices (a tie, or
  ``choose = "single"``, skips the study);
- **checked**: a fetched series must decode with a maintained pydicom decoder and be read
  by :func:`~clients.io.dicom_series.read_dicom_series` (no gaps, regular geometry) with
  its mask (:func:`~clients.io.nifti.read_nifti_mask`) before it joins the manifest; each
  instance is parsed and decoded once, as it arrives, and the series check uses those
  slices; a study's files are on the disk before the index says complete (group commit:
  one ``syncfs`` per ``parallel`` studies, not an ``fsync`` per instance);
- **reported**: one reason per skipped study (no matching series, missing label, not in
  the PACS, unsupported transfer syntax, gaps in the slices); progress (studies,
  instances, MB/s) is logged after each study.

A PACS that is down or refuses the sync raises :class:`~clients.pacs.errors.PacsError`
and so does a query matching no study: the store is then left exactly as it was, as it is
when the caller's ``check_size`` refuses the number of studies the query found (the
runtime's ``pacs.max-cohort``), which is checked before any instance is fetched.
The report holds study keys and is for the site's own logs: only counts may leave it.
With ``labels.source = "seg"`` a study's mask is read from the DICOM-SEG in the PACS that
references its chosen CT series (:mod:`clients.pacs.seg_labels`) and written on the
series' grid; a complete study is not asked for again, its SEG included.
Not done yet: the decoded cache is filled by the loader on first use (not by the sync).
"""

from __future__ import annotations

import ctypes
import fnmatch
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from io import BytesIO
from pathlib import Path

import pydicom
from pydicom.pixels import get_decoder
from pydicom.uid import UID

from clients.errors import DicomSeriesError, StudyError
from clients.io.dicom_series import (CTVolume, DecodedSlice, decode_slice, list_series_files,
                                     read_dicom_series)
from clients.io.nifti import read_nifti_mask, write_nifti_mask
from clients.pacs.cohort import Cohort, LabelRow
from clients.pacs.errors import PacsError, StudySkipped
from clients.pacs.seg_labels import seg_mask
from clients.pacs.transport import PacsTransport, SeriesRecord, StudyRecord, open_transport
from clients.pe_seg.manifest import ManifestRow, write_manifest
from clients.site.atomic_file import write_atomic

__all__ = ["SyncReport", "sync_cohort", "store_dir", "INDEX_NAME", "REPORT_NAME", "STORE_DIR"]

logger = logging.getLogger(__name__)
INDEX_NAME = "pacs-index.json"
REPORT_NAME = "pacs-report.json"
#: The folder of the state dir that holds the synced cohorts.
STORE_DIR = "pacs"
_COMPLETE, _PARTIAL, _SKIPPED = "complete", "partial", "skipped"


@dataclass
class SyncReport:
    """What one sync did: counts, bytes and time, and one reason per skipped study key."""

    studies_in_pacs: int = 0
    synced: int = 0
    fetched_studies: int = 0
    fetched_instances: int = 0
    fetched_bytes: int = 0
    removed: int = 0
    seconds: float = 0.0
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def mb_per_s(self) -> float:
        """Fetched megabytes (10^6 bytes) per second of the sync."""
        return self.fetched_bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


def store_dir(cohort: Cohort, state_dir: Path) -> Path:
    """The cohort's site folder under ``state_dir`` (``pacs/<name>``)."""
    return Path(state_dir) / STORE_DIR / cohort.name


def _private_folder(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def _digest(uid: str) -> str:
    return hashlib.sha1(uid.encode()).hexdigest()[:24]


def _instance_files(folder: Path) -> dict[str, Path]:
    """The instance files of a store series folder by name (an interrupted write's ``.tmp`` removed)."""
    files = {}
    for path in folder.iterdir() if folder.is_dir() else ():
        if path.suffix == ".tmp":
            path.unlink()
        elif path.is_file():
            files[path.name] = path
    return files


def _study_id(record: StudyRecord, label: LabelRow) -> str:
    return label.study_id or "study-" + hashlib.sha256(record.study_uid.encode()).hexdigest()[:12]


class _Store:
    """The cohort's folder: its index, series files and masks."""

    def __init__(self, root: Path) -> None:
        _private_folder(root.parent)
        self.root = _private_folder(root)
        path = root / INDEX_NAME
        self.index: dict[str, dict] = json.loads(path.read_text()) if path.is_file() else {}

    def series_dir(self, series_uid: str) -> Path:
        return self.root / "series" / _digest(series_uid)

    def mask_path(self, study_id: str) -> Path:
        return self.root / "masks" / f"{study_id}.nii.gz"

    def save_index(self) -> None:
        text = json.dumps(self.index, indent=1, sort_keys=True).encode()
        write_atomic(self.root / INDEX_NAME, lambda handle: handle.write(text))

    def sweep(self) -> None:
        """Remove the series folders no index entry names (a study interrupted mid-fetch
        that has since left the cohort)."""
        named = {_digest(entry["series"]) for entry in self.index.values() if entry.get("series")}
        for folder in (self.root / "series").iterdir() if (self.root / "series").is_dir() else ():
            if folder.name not in named:
                shutil.rmtree(folder, ignore_errors=True)

    def forget(self, study_uid: str) -> None:
        entry = self.index.pop(study_uid)
        if entry.get("series"):
            shutil.rmtree(self.series_dir(entry["series"]), ignore_errors=True)
        if entry.get("study_id"):
            self.mask_path(entry["study_id"]).unlink(missing_ok=True)


def choose_series(series: list[SeriesRecord], cohort: Cohort, key: str) -> SeriesRecord:
    """The study's series by the cohort's rule (module docstring), else :class:`StudySkipped`."""
    rule, body_part = cohort.series, cohort.query.body_part
    matching = [s for s in series if fnmatch.fnmatchcase(s.description, rule.description)
                and (not body_part or s.body_part.upper() == body_part.upper())]
    what = (f"{cohort.query.modality} series matching description {rule.description!r}"
            + (f" and body part {body_part}" if body_part else ""))
    if not matching:
        raise StudySkipped(f"study {key}: no matching series (no {what})")
    if len(matching) == 1:
        return matching[0]
    if rule.choose == "single":
        raise StudySkipped(f"study {key}: {len(matching)} {what} (series.choose = 'single')")
    thinnest = min(s.thickness_mm if s.thickness_mm is not None else float("inf") for s in matching)
    tied = [s for s in matching if s.thickness_mm == thinnest]
    if len(tied) != 1:
        raise StudySkipped(f"study {key}: {len(tied)} {what} with the same thinnest slices "
                           f"({thinnest} mm); series.choose = 'thinnest' cannot pick one")
    return tied[0]


def _decodable(syntax: str) -> bool:
    try:
        return get_decoder(syntax).is_available
    except NotImplementedError:
        return False


def _unsupported(syntax: str, key: str) -> StudySkipped:
    name = UID(syntax).name
    return StudySkipped(f"study {key}: unsupported transfer syntax {syntax} ({name})")


def _check_transfer_syntax(files: list[Path], key: str) -> None:
    """Skip the study when the first or last of ``files`` (already in the store) is in a
    transfer syntax no installed pydicom decoder reads."""
    for path in files[:1] + files[-1:]:
        syntax = str(pydicom.dcmread(path, stop_before_pixels=True).file_meta.TransferSyntaxUID)
        if not _decodable(syntax):
            raise _unsupported(syntax, key)


def _sync_disk(folder: Path) -> None:
    """Put every file written under ``folder`` on the disk: ``syncfs(2)`` of its file system
    (Linux; one journal commit for a batch of studies, where an ``fsync`` per instance costs
    one each), else ``os.sync``."""
    syncfs = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)
    fd = os.open(folder, os.O_RDONLY)
    try:
        if syncfs is None or syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


class _Stopped(PacsError):
    """Another study's failure stops the sync: this one's fetch ends at its next instance
    (never retried; the sync raises the other study's failure)."""


class _Arrivals:
    """A series' instances as they arrive: each written as the bytes the PACS sent (named by
    a hash of its SOPInstanceUID) and parsed once, for its transfer syntax and, when a
    decoder reads it, its decoded slice (:func:`~clients.io.dicom_series.decode_slice`),
    so the series check does not read the files again."""

    def __init__(self, folder: Path, stop: threading.Event) -> None:
        self.folder, self.stop = folder, stop
        self.decoded: dict[str, DecodedSlice] = {}
        self.written: list[Path] = []
        self.unsupported = ""
        self.error: DicomSeriesError | None = None
        self.bytes = 0

    def __call__(self, raw: bytes) -> None:
        if self.stop.is_set():
            raise _Stopped
        dataset = pydicom.dcmread(BytesIO(raw))
        path = self.folder / _digest(str(dataset.SOPInstanceUID))
        partial = path.with_suffix(".tmp")  # removed by the next sync if this one is killed
        with open(partial, "wb") as handle:
            handle.write(raw)
        os.replace(partial, path)  # on the disk at the sync's next commit (_sync_disk)
        self.written.append(path)
        self.bytes += len(raw)
        syntax = str(dataset.file_meta.TransferSyntaxUID)
        if not _decodable(syntax):
            self.unsupported = self.unsupported or syntax
        elif self.error is None:
            try:
                self.decoded[path.name] = decode_slice(dataset, path)
            except DicomSeriesError as exc:
                self.error = exc


@dataclass
class _Fetched:
    """One study brought into the store by :meth:`_Sync.sync_study`: its index entry and
    what it cost."""

    entry: dict
    instances: int = 0
    bytes: int = 0
    fetched: bool = False


class _Sync:
    """One run of :func:`sync_cohort`."""

    def __init__(self, cohort: Cohort, store: _Store, shared: PacsTransport | None) -> None:
        self.cohort, self.store, self.shared = cohort, store, shared
        self.parallel = 1 if shared is not None else cohort.sync.parallel
        self.report = SyncReport()
        self.started = time.monotonic()
        self.stop = threading.Event()

    def fetch_series(self, transport: PacsTransport, record: StudyRecord, series: SeriesRecord,
                     done: _Fetched) -> tuple[Path, _Arrivals]:
        """Fetch what the store lacks of ``series``; return its folder, complete, and what
        arrived. A series the store holds nothing of is fetched whole without listing its
        instances first (its count is the series query's); a resumed one lists them and
        fetches the missing ones only."""
        folder = _private_folder(self.store.series_dir(series.series_uid))
        have = _instance_files(folder)
        arrivals = _Arrivals(folder, self.stop)
        if not have:
            transport.fetch(record.study_uid, series.series_uid, None, arrivals)
            names, wanted = {path.name for path in arrivals.written}, series.instances
        else:
            uids = transport.instance_uids(record.study_uid, series.series_uid)
            names, wanted = {_digest(uid) for uid in uids}, len(uids)
            missing = [uid for uid in uids if _digest(uid) not in have]
            if missing:
                transport.fetch(record.study_uid, series.series_uid, missing, arrivals)
            for name, extra in _instance_files(folder).items():
                if name not in names:
                    extra.unlink()  # an instance the PACS no longer holds
        done.fetched, done.instances, done.bytes = bool(arrivals.written), len(arrivals.written), arrivals.bytes
        present = len(names & set(_instance_files(folder)))
        if present < max(wanted, 1):
            raise PacsError(f"PACS sent {present} of {wanted} instances of a series; the next "
                            f"sync fetches the rest")
        return folder, arrivals

    def sync_study(self, transport: PacsTransport, record: StudyRecord, key: str,
                   label: LabelRow) -> _Fetched:
        """Bring one labelled study into the store, or raise :class:`StudySkipped`."""
        study_id = _study_id(record, label)
        series = choose_series(transport.find_series(record.study_uid, self.cohort.query.modality),
                               self.cohort, key)
        done = _Fetched({"key": key, "study_id": study_id, "split": label.split,
                         "series": series.series_uid, "state": _PARTIAL})
        folder, arrivals = self.fetch_series(transport, record, series, done)
        files = list_series_files(folder)
        if arrivals.unsupported:
            raise _unsupported(arrivals.unsupported, key)
        _check_transfer_syntax([path for path in files if path.name not in arrivals.decoded], key)
        try:
            if arrivals.error is not None:
                raise arrivals.error
            volume = read_dicom_series(folder, decoded=arrivals.decoded)
        except StudyError as exc:
            raise StudySkipped(f"study {key}: gaps in the slices or bad geometry ({exc.reason})") from exc
        mask = self.store.mask_path(study_id)
        _private_folder(mask.parent)
        if label.mask is None:  # labels.source = "seg": the SEG in the PACS
            labels = seg_mask(transport, record.study_uid, series.series_uid, folder,
                              self.cohort.labels.segment, key)
            partial = mask.with_name(f".partial-{mask.name}")
            write_nifti_mask(partial, labels, volume)
            os.replace(partial, mask)
        else:
            self.copy_mask(label, volume, key, mask)
        done.entry.update(instances=len(files))  # complete once on the disk (_Sync.commit)
        return done

    def copy_mask(self, label: LabelRow, volume: CTVolume, key: str, mask: Path) -> None:
        """Copy the label CSV's mask of the study into the store, once read on ``volume``."""
        if label.mask is None or not label.mask.is_file():
            raise StudySkipped(f"study {key}: missing label (mask {label.mask} of "
                               f"{self.cohort.labels.csv.name} line {label.line} does not exist)")
        try:
            read_nifti_mask(label.mask, reference=volume)
        except StudyError as exc:
            raise StudySkipped(f"study {key}: label mask unusable ({exc.reason})") from exc
        source = label.mask
        write_atomic(mask, lambda handle: handle.write(source.read_bytes()), durable=False)

    def wanted(self, by_key: dict[str, StudyRecord]) -> list[tuple[str, StudyRecord, LabelRow | None]]:
        """The studies this sync must bring (a complete one in the same split is not asked
        for again); the others are counted done."""
        todo = []
        for key, record in by_key.items():
            label = self.cohort.labels.rows.get(key)
            entry = self.store.index.get(record.study_uid)
            if label is None or not (entry and entry["state"] == _COMPLETE and entry["split"] == label.split):
                todo.append((key, record, label))
        return todo

    def run(self, studies: list[StudyRecord]) -> SyncReport:
        """Sync the cohort's ``studies`` (the query's answer), ``parallel`` studies at a time;
        write the manifest, the index and the report."""
        cohort, report = self.cohort, self.report
        report.studies_in_pacs = len(studies)
        by_key = {(s.study_uid if cohort.labels.key == "study_instance_uid" else s.accession): s
                  for s in studies}
        for key, label in cohort.labels.rows.items():
            if key not in by_key:
                report.skipped[key] = (f"study {key}: named by {cohort.labels.csv.name} line "
                                       f"{label.line} but not in the PACS")
        todo = self.wanted(by_key)
        local = threading.local()
        opened: list[PacsTransport] = []
        lock = threading.Lock()

        def one(key: str, record: StudyRecord, label: LabelRow | None) -> _Fetched:
            if label is None:
                raise StudySkipped(f"study {key}: missing label (not in {cohort.labels.csv.name})")
            if self.shared is not None:
                return self.sync_study(self.shared, record, key, label)
            if not hasattr(local, "transport"):  # one connection per thread, closed after
                local.transport = open_transport(cohort)
                with lock:
                    opened.append(local.transport)
            return self.sync_study(local.transport, record, key, label)

        done_count = len(by_key) - len(todo)
        pending: list[tuple[StudyRecord, _Fetched]] = []
        try:
            with ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix="pacs-sync") as pool:
                futures = {pool.submit(one, *job): job for job in todo}
                try:
                    for future in as_completed(futures):
                        key, record, _ = futures[future]
                        self.record(future, key, record, pending)
                        if len(pending) >= self.parallel:
                            self.commit(pending)
                        done_count += 1
                        self.progress(done_count, len(by_key))
                except BaseException:
                    self.stop.set()  # the others stop at their next instance
                    for other in futures:
                        other.cancel()
                    raise
        finally:
            self.commit(pending)  # the studies brought in before a stop are kept
            for transport in opened:
                transport.close()
        for uid in [uid for uid in self.store.index if uid not in {s.study_uid for s in studies}]:
            self.store.forget(uid)
            report.removed += 1
        self.store.sweep()
        self.store.save_index()
        return self.finish()

    def record(self, future: Future, key: str, record: StudyRecord,
               pending: list[tuple[StudyRecord, _Fetched]]) -> None:
        """Count one study's result; a study brought in waits in ``pending`` for the next
        :meth:`commit`, a skipped one is entered at once (the failure of a study other than
        a skip propagates, the sync stopping with what it has)."""
        try:
            done = future.result()
        except StudySkipped as exc:
            self.report.skipped[key] = str(exc)
            logger.warning("PACS sync skips %s", exc)
            if record.study_uid in self.store.index:
                self.store.index[record.study_uid]["state"] = _SKIPPED
                self.store.save_index()
            return
        self.report.fetched_studies += done.fetched
        self.report.fetched_instances += done.instances
        self.report.fetched_bytes += done.bytes
        pending.append((record, done))

    def commit(self, pending: list[tuple[StudyRecord, _Fetched]]) -> None:
        """Put the ``pending`` studies' files on the disk, then mark them complete in the
        index (group commit: one ``syncfs`` for up to ``parallel`` studies)."""
        if not pending:
            return
        _sync_disk(self.store.root)
        for record, done in pending:
            self.store.index[record.study_uid] = {**done.entry, "state": _COMPLETE}
        pending.clear()
        self.store.save_index()

    def progress(self, done: int, total: int) -> None:
        """Log the sync's progress: studies, instances, MB and MB/s."""
        self.report.seconds = time.monotonic() - self.started
        logger.info("PACS sync %s: %d/%d studies, %d instances fetched, %.2f MB, %.2f MB/s",
                    self.cohort.name, done, total, self.report.fetched_instances,
                    self.report.fetched_bytes / 1e6, self.report.mb_per_s)

    def finish(self) -> SyncReport:
        """Write the manifest of the complete studies and the report."""
        root, report = self.store.root, self.report
        complete = sorted((e for e in self.store.index.values() if e["state"] == _COMPLETE),
                          key=lambda e: e["study_id"])
        write_manifest(root, [ManifestRow(e["study_id"], e["split"], self.store.series_dir(e["series"]),
                                          self.store.mask_path(e["study_id"])) for e in complete])
        report.synced = len(complete)
        report.seconds = time.monotonic() - self.started
        text = json.dumps({**asdict(report), "mb_per_s": report.mb_per_s}, indent=1).encode()
        write_atomic(root / REPORT_NAME, lambda handle: handle.write(text))
        return report


def sync_cohort(cohort: Cohort, state_dir: Path, transport: PacsTransport | None = None,
                check_size: Callable[[int], None] | None = None) -> SyncReport:
    """Sync ``cohort`` into ``store_dir(cohort, state_dir)`` (see the module docstring).

    Parameters
    ----------
    cohort : Cohort
        The parsed cohort file.
    state_dir : Path
        The site's state folder; the store is ``pacs/<cohort name>`` below it (0700).
    transport : PacsTransport, optional
        An open transport, used for every request, one study at a time (default: one
        connection for the query and one per ``[sync] parallel`` thread, each closed after).
    check_size : callable, optional
        Called with the number of studies the query found, before the store is opened
        and before any instance is fetched (the runtime's ``pacs.max-cohort`` rule): what
        it raises leaves the store exactly as it was and propagates.

    Returns
    -------
    SyncReport
        Counts, bytes, MB/s and the skipped studies with their reason.

    Raises
    ------
    PacsError
        The PACS is down, refuses the sync, or the query matches nothing; what was
        synced before stays.
    """
    own = transport is None
    transport = open_transport(cohort) if transport is None else transport
    try:
        studies = transport.find_studies(cohort.query)
        if not studies:
            raise PacsError(f"cohort {cohort.path}: the query matches no study in the PACS "
                            f"({cohort.query}); nothing changed")
        if check_size is not None:
            check_size(len(studies))
        return _Sync(cohort, _Store(store_dir(cohort, state_dir)), None if own else transport).run(studies)
    finally:
        if own:
            transport.close()
