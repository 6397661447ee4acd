"""The PACS sync against Orthanc on loopback: throughput against a plain WADO-RS loop, incremental cost.

Two synthetic pe-seg hospitals, each loaded into an Orthanc started by the product
(:class:`app.tooling.orthanc.OrthancProcess`, Debian's ``orthanc`` + ``orthanc-dicomweb``):
``--studies`` studies of 64 px x 32 slices (the per-instance and per-study costs), and
``--clinical-studies`` studies of 512 px x 64 slices (a clinical slice size: 512 kB an
instance, the per-byte costs).

- **Throughput.** The measured side is the product's sync
  (:func:`clients.pacs.sync.sync_cohort`, a fresh state folder each time) over DICOMweb
  (QIDO-RS + WADO-RS) and over DIMSE (C-FIND + C-GET). The limit is the same Orthanc
  serving the same studies to a plain WADO-RS loop in this process (``requests`` GET
  ``/dicom-web/studies/<uid>``, multipart, the body read and dropped): one loop before
  each sync, ``--repeat`` times, alternated; medians. ``mb_per_s`` is the sync's fetched
  DICOM bytes over the sync's wall time (query, series choice, writing each instance,
  decoding and checking the series, manifest); ``limit_mb_per_s`` the loop's body bytes
  over its time; ``ratio`` the first over the second.
- **Incremental.** After each full sync one study is deleted from the PACS, synced away,
  stored again, and the sync that fetches it (one new study among ``--studies``) is timed:
  ``incremental_fraction`` = median incremental time / median full-sync time.
- **Round trip.** A DICOM-SEG (:func:`clients.prediction.dicom_seg.segmentation`) and a
  TID 1500 SR (:func:`clients.prediction.dicom_sr.measurement_report`), the writers of
  ``make predict``, over a synced study: ``round_trip_valid`` when Debian's ``dciodvfy``
  reports no error on either and highdicom reads back the same mask and probability.

Targets (issue 48): ratio at least 0.8, incremental fraction at most 0.05. Wall clock on
whatever machine runs it. Results: ``bench/results/pacs.json``. Usage::

    python bench/pacs.py [--studies 100] [--repeat 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from single_thread import ROOT  # noqa: I001 - first: one BLAS thread

import highdicom as hd  # noqa: E402
import numpy as np  # noqa: E402
import pydicom  # noqa: E402
import requests  # noqa: E402
from report import Column, environment, print_table, write_report  # noqa: E402

from app.tooling.orthanc import OrthancProcess, orthanc_available  # noqa: E402
from app.tooling.pacs_hospital import SYNC_AET, load_hospital, write_cohort_file  # noqa: E402
from clients.io.dicom_series import list_series_files, read_dicom_series  # noqa: E402
from clients.io.nifti import read_nifti_mask  # noqa: E402
from clients.pacs.cohort import load_cohort  # noqa: E402
from clients.pacs.sync import sync_cohort, store_dir  # noqa: E402
from clients.pe_seg.manifest import read_manifest  # noqa: E402
from clients.pe_seg.synthetic import SiteProfile, generate_site  # noqa: E402
from clients.prediction.dicom_seg import PULMONARY_EMBOLISM, segmentation  # noqa: E402
from clients.prediction.dicom_source import ModelIdentity, read_source_instances  # noqa: E402
from clients.prediction.dicom_sr import measurement_report  # noqa: E402

TARGET_RATIO, TARGET_INCREMENTAL = 0.8, 0.05
TRANSPORTS = ("dicomweb", "dimse")
IDENTITY = ModelIdentity("fedmed-pe-seg-best", "1", "bench")


def make_hospital(folder: Path, studies: int, image_size: int, slices: int) -> Path:
    """A synthetic pe-seg site of ``studies`` studies (a tenth of them test), ``slices`` each."""
    test = max(1, studies // 10)
    profile = SiteProfile(name="hospital-00", num_studies=studies - test, noise_hu=20.0,
                          contrast_hu=200.0, slice_thickness_mm=(1.25, 2.0), num_slices=(slices, slices))
    return generate_site(folder, profile, seed=0, image_size=image_size, num_test=test)


def wado_loop(orthanc: OrthancProcess, study_uids: list[str]) -> tuple[float, int]:
    """Seconds and body bytes of GET /dicom-web/studies/<uid> (multipart) for every study."""
    session = requests.Session()
    session.auth = (orthanc.username, orthanc.password)
    accept = {"Accept": 'multipart/related; type="application/dicom"; transfer-syntax=*'}
    started, total = time.monotonic(), 0
    for uid in study_uids:
        response = session.get(f"{orthanc.dicomweb_url}/studies/{uid}", headers=accept, timeout=120)
        response.raise_for_status()
        total += len(response.content)
    return time.monotonic() - started, total


def timed_sync(cohort_file: Path, state: Path) -> tuple[float, int, int]:
    """Seconds, fetched studies and fetched bytes of one product sync into ``state``."""
    started = time.monotonic()
    report = sync_cohort(load_cohort(cohort_file), state)
    seconds = time.monotonic() - started
    if report.skipped:
        raise RuntimeError(f"the sync skipped studies: {report.skipped}")
    return seconds, report.fetched_studies, report.fetched_bytes


def measure(orthanc: OrthancProcess, site: Path, work: Path, repeat: int, size: int,
            slices: int) -> list[dict]:
    """One row per transport: medians over ``repeat`` alternations of the loop and the sync."""
    uids = [pydicom.dcmread(list_series_files(e.image_dir)[0], stop_before_pixels=True).StudyInstanceUID
            for e in read_manifest(site)]
    newcomer = list_series_files(read_manifest(site)[-1].image_dir)
    rows = []
    for transport in TRANSPORTS:
        cohort_file = write_cohort_file(orthanc, work / "hospital", transport, name=f"bench-{transport}")
        loops, syncs, increments = [], [], []
        for attempt in range(repeat):
            loops.append(wado_loop(orthanc, uids))
            state = work / f"state-{transport}-{attempt}"
            syncs.append(timed_sync(cohort_file, state))
            orthanc.delete_study(uids[-1])
            sync_cohort(load_cohort(cohort_file), state)  # the study leaves the store
            orthanc.upload(newcomer)
            increments.append(timed_sync(cohort_file, state))
            if increments[-1][1] != 1:
                raise RuntimeError(f"the incremental sync fetched {increments[-1][1]} studies, not 1")
            shutil.rmtree(state)
        full_s = statistics.median(s for s, _, _ in syncs)
        loop_s = statistics.median(s for s, _ in loops)
        mb = syncs[0][2] / 1e6
        mb_per_s, limit = mb / full_s, loops[0][1] / 1e6 / loop_s
        rows.append({"transport": transport, "studies": len(uids), "image_size": size,
                     "slices_per_study": slices, "mb_per_s": round(mb_per_s, 3),
                     "limit_mb_per_s": round(limit, 3), "ratio": round(mb_per_s / limit, 3),
                     "incremental_fraction": round(statistics.median(s for s, _, _ in increments) / full_s, 4),
                     "studies_per_min": round(len(uids) / full_s * 60, 1),
                     "limit_studies_per_min": round(len(uids) / loop_s * 60, 1),
                     "mb": round(mb, 3), "full_sync_s": [round(s, 3) for s, _, _ in syncs],
                     "limit_loop_s": [round(s, 3) for s, _ in loops],
                     "incremental_sync_s": [round(s, 3) for s, _, _ in increments]})
    return rows


def _dciodvfy_errors(path: Path) -> list[str]:
    done = subprocess.run(["dciodvfy", str(path)], capture_output=True, text=True, timeout=120)
    return [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("Error")]


def round_trip(series_dir: Path, mask_path: Path, out: Path) -> dict:
    """The product's SEG and SR over a synced series: dciodvfy errors, and what highdicom reads back."""
    instances = read_source_instances(series_dir)
    mask = read_nifti_mask(mask_path, reference=read_dicom_series(series_dir)).astype(np.uint8)
    out.mkdir(parents=True, exist_ok=True)
    seg_path, sr_path, probability = out / "seg.dcm", out / "sr.dcm", 0.8125
    segmentation(mask, instances, PULMONARY_EMBOLISM, IDENTITY, series_dir).save_as(
        seg_path, enforce_file_format=True)
    measurement_report((probability,), instances, IDENTITY, series_dir).save_as(
        sr_path, enforce_file_format=True)
    frames = hd.seg.segread(seg_path).get_pixels_by_source_instance(
        [ds.SOPInstanceUID for ds in instances], segment_numbers=[1])[..., 0]
    report = hd.sr.MeasurementReport.from_sequence([hd.sr.srread(sr_path)])
    (group,) = report.get_image_measurement_groups()
    (measurement,) = group.get_measurements()
    errors = {"seg": _dciodvfy_errors(seg_path), "sr": _dciodvfy_errors(sr_path)}
    same_mask = bool(np.array_equal(frames, mask)) and int(mask.sum()) > 0
    same_probability = abs(float(measurement.value) - probability) < 1e-6
    return {"valid": not errors["seg"] and not errors["sr"] and same_mask and same_probability,
            "dciodvfy_errors": errors, "same_mask": same_mask, "mask_voxels": int(mask.sum()),
            "same_probability": same_probability}


COLUMNS = (Column("transport", "<9", lambda r: r["transport"]),
           Column("px", "4d", lambda r: r["image_size"]),
           Column("studies", "7d", lambda r: r["studies"]),
           Column("MB/s", "7.2f", lambda r: r["mb_per_s"]),
           Column("limit MB/s", "10.2f", lambda r: r["limit_mb_per_s"]),
           Column("ratio", "6.2f", lambda r: r["ratio"]),
           Column("studies/min", "11.0f", lambda r: r["studies_per_min"]),
           Column("incremental", "11.3f", lambda r: r["incremental_fraction"]))


def configuration(work: Path, name: str, studies: int, size: int, slices: int,
                  repeat: int) -> tuple[list[dict], dict | None]:
    """Generate one hospital, load it into its own Orthanc, measure; the round trip over
    its first test study (``None`` unless ``name`` is ``small``)."""
    site = make_hospital(work / name / "site" / "hospital-00", studies, size, slices)
    orthanc = OrthancProcess.start(work / name / "orthanc", aet="BENCH", peers={"sync": (SYNC_AET, 104)})
    try:
        load_hospital(orthanc, site, work / name / "hospital")
        rows = measure(orthanc, site, work / name, repeat, size, slices)
        trip = None
        if name == "small":
            cohort = load_cohort(write_cohort_file(orthanc, work / name / "hospital", name="round-trip"))
            sync_cohort(cohort, work / name / "state-rt")
            entry = next(e for e in read_manifest(store_dir(cohort, work / name / "state-rt"))
                         if e.split == "test")  # the test studies have emboli: a non-empty mask
            trip = round_trip(entry.image_dir, entry.mask_path, work / name / "round-trip")
    finally:
        orthanc.stop()
        shutil.rmtree(work / name / "orthanc", ignore_errors=True)
    return rows, trip


def main(argv: list[str] | None = None) -> int:
    """Start Orthanc, load the hospitals, measure, check the round trip, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=100, help="studies of 64 px x 32 slices")
    parser.add_argument("--clinical-studies", type=int, default=10,
                        help="studies of 512 px x 64 slices (0: none)")
    parser.add_argument("--repeat", type=int, default=3, help="alternations of loop and sync")
    parser.add_argument("--quick", action="store_true",
                        help="6 studies of 32 px x 8 slices and 2 of 128 px x 8, 1 repeat")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "pacs.json")
    args = parser.parse_args(argv)
    missing = orthanc_available() or ("" if shutil.which("dciodvfy") else "missing dciodvfy (dicom3tools)")
    if missing:
        raise SystemExit(f"bench/pacs.py: {missing}")
    if args.quick:
        configs, repeat = [("small", 6, 32, 8), ("clinical", 2, 128, 8)], 1
    else:
        configs = [("small", args.studies, 64, 32)] + (
            [("clinical", args.clinical_studies, 512, 64)] if args.clinical_studies else [])
        repeat = args.repeat
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, studies, size, slices in configs:
            found, trip_here = configuration(Path(tmp), name, studies, size, slices, repeat)
            rows += found
            trip = trip_here if trip_here is not None else trip
    write_report(args.out, {"runs": rows, "round_trip_valid": trip["valid"], "round_trip": trip,
                            "repeat": repeat,
                            "targets": {"ratio": TARGET_RATIO, "incremental_fraction": TARGET_INCREMENTAL},
                            **environment(), "platform": platform.platform(), "cpus": os.cpu_count(),
                            "note": "Orthanc and the sync on loopback on one shared machine"})
    print_table("PACS sync against Orthanc on loopback (medians)", COLUMNS, rows)
    print(f"round trip (SEG + SR: dciodvfy, highdicom read-back): {'valid' if trip['valid'] else 'INVALID'}")
    return 0 if trip["valid"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
