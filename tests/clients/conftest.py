"""Shared fixtures for the site-side data layer tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from clients.io.dicom_series import CTVolume, read_dicom_series
from clients.pe_seg.synthetic import SiteProfile, generate_site
from clients.registry import synthetic_module

#: ../shared/data relative to the project root (see DESIGN.md, "Real data").
REAL_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
REAL_SERIES = REAL_DATA / "ctpa" / "ct_dicom_series"
REAL_LABELS = REAL_DATA / "ctpa" / "ct_dicom_series_labels.nii.gz"

#: A small, fast hospital for tests (4 studies, 10-14 slices, 48 px).
SMALL_PROFILE = SiteProfile(
    name="test-hospital",
    num_studies=4,
    noise_hu=20.0,
    contrast_hu=200.0,
    slice_thickness_mm=(2.0, 3.0),
    num_slices=(10, 14),
)
SMALL_SIZE = 48


@pytest.fixture(scope="session")
def small_profile() -> SiteProfile:
    """Profile of the small test hospital."""
    return SMALL_PROFILE


@pytest.fixture(scope="session")
def real_labels_path() -> Path:
    """The real multi-label NIfTI of the real series (skips when absent)."""
    if not REAL_LABELS.is_file():
        pytest.skip(f"real data not found at {REAL_LABELS} (../shared/data is optional)")
    return REAL_LABELS


@pytest.fixture(scope="session")
def real_volume() -> CTVolume:
    """The real 20-slice CT series, read once (skips when the shared data is absent)."""
    if not REAL_SERIES.is_dir():
        pytest.skip(f"real data not found at {REAL_SERIES} (../shared/data is optional)")
    return read_dicom_series(REAL_SERIES)


@pytest.fixture(scope="session")
def small_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated synthetic hospital; read-only for tests (copy it before corrupting)."""
    return generate_site(tmp_path_factory.mktemp("site") / "hospital", SMALL_PROFILE, seed=7,
                         image_size=SMALL_SIZE, num_test=1)


@pytest.fixture(scope="session")
def synthetic_site(tmp_path_factory):
    """``synthetic_site(task, seed, image_size=64)``: the folder of one synthetic hospital of ``task``."""

    def make(task: str, seed: int, image_size: int = 64) -> Path:
        root = tmp_path_factory.mktemp(task)
        synthetic_module(task).generate_federation(root, num_sites=1, seed=seed, image_size=image_size)
        return root / "hospital-00"

    return make
