"""``make simulate DATA=pacs``: the synthetic hospitals federate from one Orthanc each.

:func:`pacs_sites` takes the synthetic hospitals ``<data-root>/hospital-NN`` that
``make simulate`` generates, starts one :class:`~app.tooling.orthanc.OrthancProcess` per
hospital (loopback, generated configuration), stores each hospital's series in its
Orthanc with its ``labels.csv`` and cohort file (:mod:`app.tooling.pacs_hospital`), and
syncs each cohort over DICOMweb (:func:`clients.pacs.sync.sync_cohort`) into a folder
the product makes under the simulation's work folder (mode 0700)::

    <work>/<data-root name>/
        hospital-NN/orthanc/        that hospital's Orthanc (removed at the end)
        hospital-NN/cohort/         its labels.csv and hospital-NN.toml
        state/pacs/hospital-NN/     the synced site folder (kept: the next run is incremental)

It yields ``<work>/<data-root name>/state/pacs``, which holds ``hospital-NN`` site
folders as ``<data-root>`` does: the federation then runs exactly as over the folders.
Every Orthanc is stopped when the block ends, on success, failure or Ctrl-C.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from app.tooling.errors import FlowerProcessError
from app.tooling.orthanc import OrthancProcess
from app.tooling.pacs_hospital import SYNC_AET, load_hospital, write_cohort_file
from clients.datagen.federation import hospital_name
from clients.pacs.cohort import load_cohort
from clients.pacs.errors import CohortError, PacsError
from clients.pacs.sync import sync_cohort

__all__ = ["pacs_sites"]


def _private(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


@contextlib.contextmanager
def pacs_sites(data_root: Path, sites: int, work_dir: Path,
               echo: Callable[[str], None] = print) -> Iterator[Path]:
    """Load ``sites`` hospitals of ``data_root`` into an Orthanc each, sync them; yield the synced root.

    Raises
    ------
    FlowerProcessError
        An Orthanc does not start, or a sync fails or skips a study (the folders'
        federation would then differ); every Orthanc started is stopped first.
    """
    root = _private(Path(work_dir).resolve() / Path(data_root).resolve().name)
    state = _private(root / "state")
    started: list[OrthancProcess] = []
    try:
        for index in range(sites):
            name = hospital_name(index)
            folder = _private(root / name)
            orthanc = OrthancProcess.start(folder / "orthanc", aet=f"HOSPITAL{index:02d}",
                                           peers={"sync": (SYNC_AET, 104)})
            started.append(orthanc)
            began = time.monotonic()
            load_hospital(orthanc, Path(data_root) / name, folder / "cohort")
            echo(f"{name}: Orthanc {orthanc.aet} on {orthanc.url} (folder {orthanc.folder}), "
                 f"loaded in {time.monotonic() - began:.1f} s\n")
            cohort_file = write_cohort_file(orthanc, folder / "cohort", "dicomweb", name=name)
            try:
                report = sync_cohort(load_cohort(cohort_file), state)
            except (PacsError, CohortError) as exc:
                raise FlowerProcessError(f"{name}: PACS sync failed: {exc}") from exc
            if report.skipped:
                reasons = "; ".join(report.skipped.values())
                raise FlowerProcessError(f"{name}: the PACS sync skipped studies: {reasons}")
            echo(f"{name}: synced {report.synced} studies over DICOMweb ({report.fetched_studies} "
                 f"fetched, {report.fetched_bytes / 1e6:.2f} MB, {report.mb_per_s:.2f} MB/s) "
                 f"into {state / 'pacs' / name}\n")
        yield state / "pacs"
    finally:
        for orthanc in started:
            orthanc.remove_folder()
        if started:
            echo(f"stopped {len(started)} Orthanc(s)\n")
