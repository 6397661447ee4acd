"""A real Orthanc for the PACS tests: Debian's, started by the test, tiny synthetic studies.

Without Orthanc (``/usr/sbin/Orthanc`` and its DICOMweb plugin) the tests skip, except
under CI (the ``CI`` variable set), where they fail: ``.ci/run`` installs it with apt.
One Orthanc holding a 3-study hospital (32 px, 4-6 slices) serves the read-only tests
(session scope); a test that changes its PACS starts its own (``orthanc_factory``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.tooling.orthanc import OrthancProcess, orthanc_available
from app.tooling.pacs_hospital import SYNC_AET, load_hospital, write_cohort_file
from app.tooling.process_tree import descendants
from clients.pe_seg.synthetic import SiteProfile, generate_site

PROFILE = SiteProfile(name="hospital-00", num_studies=2, noise_hu=10.0, contrast_hu=150.0,
                      slice_thickness_mm=(1.25, 1.75), num_slices=(4, 6))


def require_orthanc() -> None:
    """Skip without Debian's Orthanc, fail under CI (which must run the PACS tests)."""
    missing = orthanc_available()
    if not missing:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {missing}: the PACS tests must run", pytrace=False)
    pytest.skip(missing)


@dataclass
class Hospital:
    """A synthetic pe-seg site folder loaded into an Orthanc, with its labels.csv."""

    orthanc: OrthancProcess
    site_dir: Path
    out_dir: Path

    def cohort_file(self, transport: str = "dicomweb", extra: str = "", name: str = "cohort") -> Path:
        return write_cohort_file(self.orthanc, self.out_dir, transport, name=name, extra=extra)


def stop_and_check(orthanc: OrthancProcess) -> None:
    """Stop ``orthanc`` and assert it left no process behind."""
    helpers = descendants(orthanc.pid)
    orthanc.stop()
    assert orthanc.process.poll() is not None
    for pid, _ in helpers:
        assert not Path(f"/proc/{pid}").exists(), f"Orthanc left process {pid}"


@pytest.fixture(scope="session")
def site_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-study synthetic hospital (2 train/val + 1 test), 32 px, 4-6 slices."""
    return generate_site(tmp_path_factory.mktemp("site") / "hospital-00", PROFILE, seed=0,
                         image_size=32, num_test=1)


@pytest.fixture
def orthanc_factory(tmp_path: Path) -> Iterator[Callable[[str], OrthancProcess]]:
    """Start Orthancs (each with the sync's AE title as a peer); stopped and checked after the test."""
    require_orthanc()
    started: list[OrthancProcess] = []

    def start(aet: str = "HOSPITAL") -> OrthancProcess:
        orthanc = OrthancProcess.start(tmp_path / f"orthanc-{len(started)}", aet=aet,
                                       peers={"sync": (SYNC_AET, 104)})
        started.append(orthanc)
        return orthanc

    yield start
    for orthanc in started:
        stop_and_check(orthanc)


@pytest.fixture(scope="session")
def hospital(site_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hospital]:
    """The session's Orthanc holding ``site_dir``'s studies (never changed by a test)."""
    require_orthanc()
    root = tmp_path_factory.mktemp("pacs")
    orthanc = OrthancProcess.start(root / "orthanc", aet="HOSPITAL00", peers={"sync": (SYNC_AET, 104)})
    try:
        load_hospital(orthanc, site_dir, root / "hospital")
        yield Hospital(orthanc, site_dir, root / "hospital")
    finally:
        stop_and_check(orthanc)


@pytest.fixture
def own_hospital(site_dir: Path, orthanc_factory, tmp_path: Path) -> Hospital:
    """A hospital in an Orthanc of its own (the test may change its PACS and labels)."""
    orthanc = orthanc_factory("HOSPITAL01")
    load_hospital(orthanc, site_dir, tmp_path / "hospital")
    return Hospital(orthanc, site_dir, tmp_path / "hospital")


def copy_labels(hospital: Hospital, out_dir: Path) -> Path:
    """A copy of the hospital's labels.csv in ``out_dir`` (to edit)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(hospital.out_dir / "labels.csv", out_dir / "labels.csv")
    return out_dir / "labels.csv"
