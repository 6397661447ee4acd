"""`make simulate DATA_DIR=<folder of sites>` uses the sites as they are (issue #12)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _make_n(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    return subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def _sites(folder: Path) -> Path:
    for name in ("hospital-00", "hospital-01"):
        (folder / name / "dicom").mkdir(parents=True)
        (folder / name / "images.csv").write_text("image_id,split,image,labels\n")
    return folder


@pytest.mark.parametrize("data", ["", "DATA=shared"])
def test_simulate_on_a_folder_of_sites_generates_nothing(tmp_path, data) -> None:
    hospitals = _sites(tmp_path / "hospitals")
    out = _make_n("simulate", "TASK=cxr-cls", f"DATA_DIR={hospitals}", "SITES=2", *filter(None, [data]))
    assert out.returncode == 0, out.stderr
    assert "clients.datagen" not in out.stdout  # neither the generator nor the shared converter
    assert f"touch {hospitals}" not in out.stdout
    assert f"--data-root {hospitals} --sites 2" in out.stdout


def test_data_dir_from_the_environment_counts_as_given(tmp_path) -> None:
    hospitals = _sites(tmp_path / "hospitals")
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "-n", "--no-print-directory", "data"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, env={"PATH": "/usr/bin:/bin", "DATA_DIR": str(hospitals)})
    assert out.returncode == 0, out.stderr
    assert "clients.datagen" not in out.stdout and "using them as they are" in out.stdout


def test_a_new_data_dir_and_the_default_folder_are_generated(tmp_path) -> None:
    new = tmp_path / "demo-data"
    out = _make_n("data", "SITES=2", f"DATA_DIR={new}")
    assert out.returncode == 0, out.stderr
    assert f"-m clients.datagen synthetic --task pe-seg --out {new} --sites 2" in out.stdout
    default = _make_n("simulate", "TASK=cxr-cls", "SEED=918273")
    assert default.returncode == 0, default.stderr
    assert f"--out {ROOT}/data/synthetic-cxr-cls-seed918273 --sites 3" in default.stdout
