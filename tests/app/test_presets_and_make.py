"""Run-config presets are valid, and `make` wires DATA=shared to the shared-set converter."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from app.config.run_config import RunConfig

ROOT = Path(__file__).resolve().parents[2]
# configs/ also holds files that are not run configs: a SuperNode's node config,
# the coordinator's roster, the site policies.
NOT_PRESETS = ("node-", "roster.", "site-policy")
PRESETS = sorted(p for p in (ROOT / "configs").glob("*.toml")
                 if not p.name.startswith(NOT_PRESETS))


@pytest.mark.parametrize("preset", PRESETS, ids=[p.name for p in PRESETS])
def test_presets_are_valid_run_configs(preset: Path) -> None:
    with preset.open("rb") as handle:
        values = tomllib.load(handle)
    config = RunConfig.from_mapping(values)
    assert config.task in preset.name or "task" not in values


def test_msd_preset_is_plain_2d() -> None:
    with (ROOT / "configs/pe-seg-msd-lung.toml").open("rb") as handle:
        config = RunConfig.from_mapping(tomllib.load(handle))
    assert (config.task_sizes.slab_slices, config.task_sizes.image_size) == (1, 48)


def _make_n(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    return subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_simulate_data_shared_converts_the_set_and_uses_its_preset() -> None:
    out = _make_n("simulate", "TASK=pe-seg", "DATA=shared", "SET=msd-lung", "SITES=2",
                  "SCHEME=dirichlet", "ALPHA=0.3", "SEED=4")
    assert out.returncode == 0, out.stderr
    folder = f"{ROOT}/data/shared-msd-lung-dirichlet0.3-seed4"
    assert "-m clients.datagen shared --task pe-seg --set msd-lung" in out.stdout
    assert "--sites 2 --scheme dirichlet --alpha 0.3 --seed 4" in out.stdout
    assert f"--out {folder}" in out.stdout and f"--data-root {folder}" in out.stdout
    assert f"--preset {ROOT}/configs/pe-seg-msd-lung.toml" in out.stdout
    assert "-c experiment=fedmed-pe-seg-msd-lung" in out.stdout


def test_simulate_default_stays_synthetic() -> None:
    out = _make_n("simulate", "TASK=pe-seg")
    assert out.returncode == 0, out.stderr
    assert "clients.datagen shared" not in out.stdout and "experiment=" not in out.stdout
    assert "--preset" not in out.stdout


def test_simulate_data_pacs_federates_from_the_pacs() -> None:
    out = _make_n("simulate", "DATA=pacs")
    assert out.returncode == 0, out.stderr
    assert "--data-source pacs" in out.stdout and "clients.datagen shared" not in out.stdout


def test_data_path_is_refused_by_simulate_but_not_by_supernode() -> None:
    bad = _make_n("simulate", "DATA=/abs/site")
    assert bad.returncode != 0 and "DATA=synthetic (default), DATA=shared or DATA=pacs" in bad.stderr
    good = _make_n("supernode", "SITE=hospital-a", "DATA=/abs/site")
    assert good.returncode == 0, good.stderr
    assert "--data /abs/site" in good.stdout
