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
- **resumable**: every instance is written atomically as it arrives and the index after
  every study, so an interrupted sync leaves complete files only; the next sync fetches
  just the instances a study still lacks;
- **explicit in its series choice**: the series of the query's modality whose
  description matches ``series.description`` (DICOM wildcards) and whose body part is
  ``query.body-part`` (when set); of several, the thinnest slices (a tie, or
  ``choose = "single"``, skips the study);
- **checked**: a fetched series must decode with a maintained pydicom decoder and be read
  by :func:`~clients.io.dicom_series.read_dicom_series` (no gaps, regular geometry) with
  its mask (:func:`~clients.io.nifti.read_nifti_mask`) before it joins the manifest;
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

import fnmatch
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pydicom
from pydicom.dataset import Dataset
from pydicom.pixels import get_decoder

from clients.errors import StudyError
from clients.io.dicom_series import CTVolume, list_series_files, read_dicom_series
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


def _check_transfer_syntax(files: list[Path], key: str) -> None:
    for path in files[:1] + files[-1:]:
        syntax = pydicom.dcmread(path, stop_before_pixels=True).file_meta.TransferSyntaxUID
        try:
            available = get_decoder(syntax).is_available
        except NotImplementedError:
            available = False
        if not available:
            raise StudySkipped(f"study {key}: unsupported transfer syntax {syntax} ({syntax.name})")


class _Sync:
    """One run of :func:`sync_cohort`."""

    def __init__(self, cohort: Cohort, store: _Store, transport: PacsTransport) -> None:
        self.cohort, self.store, self.transport = cohort, store, transport
        self.report = SyncReport()
        self.started = time.monotonic()

    def store_instance(self, folder: Path, dataset: Dataset) -> None:
        """Write one fetched instance atomically (its name: a hash of its SOPInstanceUID); on
        the disk once its study is complete (:meth:`sync_study` syncs once per study)."""
        path = folder / _digest(str(dataset.SOPInstanceUID))
        write_atomic(path, lambda handle: dataset.save_as(handle, enforce_file_format=True),
                     durable=False)
        self.report.fetched_instances += 1
        self.report.fetched_bytes += path.stat().st_size

    def fetch_series(self, record: StudyRecord, series: SeriesRecord) -> Path:
        """Fetch what the store lacks of ``series``; return its folder, complete."""
        folder = _private_folder(self.store.series_dir(series.series_uid))
        have = _instance_files(folder)
        wanted = self.transport.instance_uids(record.study_uid, series.series_uid)
        missing = [uid for uid in wanted if _digest(uid) not in have]
        if missing:
            self.report.fetched_studies += 1
            self.transport.fetch(record.study_uid, series.series_uid,
                                 None if not have else missing,
                                 lambda dataset: self.store_instance(folder, dataset))
        names = {_digest(uid) for uid in wanted}
        for name, extra in _instance_files(folder).items():
            if name not in names:
                extra.unlink()  # an instance the PACS no longer holds
        lacking = names - set(_instance_files(folder))
        if lacking:
            raise PacsError(f"PACS sent {len(wanted) - len(lacking)} of {len(wanted)} instances "
                            f"of a series; the next sync fetches the rest")
        return folder

    def sync_study(self, record: StudyRecord, key: str, label: LabelRow) -> None:
        """Bring one labelled study into the store, or raise :class:`StudySkipped`."""
        entry = self.store.index.get(record.study_uid)
        if entry and entry["state"] == _COMPLETE and entry["split"] == label.split:
            return
        study_id = _study_id(record, label)
        series = choose_series(self.transport.find_series(record.study_uid, self.cohort.query.modality),
                               self.cohort, key)
        self.store.index[record.study_uid] = {"key": key, "study_id": study_id, "split": label.split,
                                              "series": series.series_uid, "state": _PARTIAL}
        self.store.save_index()
        folder = self.fetch_series(record, series)
        files = list_series_files(folder)
        _check_transfer_syntax(files, key)
        try:
            volume = read_dicom_series(folder)
        except StudyError as exc:
            raise StudySkipped(f"study {key}: gaps in the slices or bad geometry ({exc.reason})") from exc
        mask = self.store.mask_path(study_id)
        _private_folder(mask.parent)
        if label.mask is None:  # labels.source = "seg": the SEG in the PACS
            labels = seg_mask(self.transport, record.study_uid, series.series_uid, folder,
                              self.cohort.labels.segment, key)
            partial = mask.with_name(f".partial-{mask.name}")
            write_nifti_mask(partial, labels, volume)
            os.replace(partial, mask)
        else:
            self.copy_mask(label, volume, key, mask)
        os.sync()  # the study's instances and mask on the disk before the index says complete
        self.store.index[record.study_uid].update(state=_COMPLETE, instances=len(files))

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
        write_atomic(mask, lambda handle: handle.write(source.read_bytes()))

    def run(self, studies: list[StudyRecord]) -> SyncReport:
        """Sync the cohort's ``studies`` (the query's answer); write the manifest, the index
        and the report."""
        cohort, report = self.cohort, self.report
        report.studies_in_pacs = len(studies)
        by_key = {(s.study_uid if cohort.labels.key == "study_instance_uid" else s.accession): s
                  for s in studies}
        for key, label in cohort.labels.rows.items():
            if key not in by_key:
                report.skipped[key] = (f"study {key}: named by {cohort.labels.csv.name} line "
                                       f"{label.line} but not in the PACS")
        for number, (key, record) in enumerate(by_key.items(), start=1):
            label = cohort.labels.rows.get(key)
            try:
                if label is None:
                    raise StudySkipped(f"study {key}: missing label (not in {cohort.labels.csv.name})")
                self.sync_study(record, key, label)
            except StudySkipped as exc:
                report.skipped[key] = str(exc)
                logger.warning("PACS sync skips %s", exc)
                if record.study_uid in self.store.index:
                    self.store.index[record.study_uid]["state"] = _SKIPPED
            finally:
                self.store.save_index()
            self.progress(number, len(by_key))
        for uid in [uid for uid in self.store.index if uid not in {s.study_uid for s in studies}]:
            self.store.forget(uid)
            report.removed += 1
        self.store.save_index()
        return self.finish()

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
        An open transport (default: one for the cohort's ``[pacs]`` section, closed after).
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
        return _Sync(cohort, _Store(store_dir(cohort, state_dir)), transport).run(studies)
    finally:
        if own:
            transport.close()
