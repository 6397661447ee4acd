"""``make simulate RAY_ADDRESS=...``: the federation runs on an existing Ray cluster.

A Ray head and one worker node (one CPU each) are started on 127.0.0.1 with a
private ``--temp-dir`` and stopped by PID; two tiny synthetic chest X-ray
hospitals (8 radiographs of 32 px) federate for one round through
``python -m app.tooling.simulate --ray-address``. The cluster's job table
must then hold the ``flwr-simulation`` driver: a run that silently started its
own Ray never appears there. An address where nothing listens is refused
before any Flower process starts.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from app.tooling import simulate
from app.tooling.environment import free_port
from tests.fixtures.ray_cluster import LocalRayCluster
from clients.cxr_cls.synthetic import generate_site, site_profiles

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def _tiny_hospitals(root: Path, sites: int) -> None:
    for profile in site_profiles(sites, seed=5):
        generate_site(root / profile.name, dataclasses.replace(profile, num_images=8), seed=5,
                      image_size=32, val_fraction=0.25)


@pytest.mark.skipif(os.environ.get("FEDMED_RAY_CLUSTER_TEST") != "1",
                    reason="6 min on 2 cores, past CI's budget: `make test-ray-cluster` runs it")
def test_simulation_attaches_to_an_existing_ray_cluster(tmp_path):
    pytest.importorskip("ray")

    data_root = tmp_path / "data"
    _tiny_hospitals(data_root, 2)
    # Ray's unix sockets live under the temp dir (107 bytes at most): a short private folder.
    temp_dir = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    try:
        cluster = LocalRayCluster.start(temp_dir, head_cpus=1, worker_cpus=(1,))
        try:
            result = subprocess.run(_simulate_command(tmp_path, data_root, cluster.address),
                                    cwd=ROOT, env=_environment(), capture_output=True,
                                    text=True, timeout=400, check=False)
            assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
            assert "status: finished:completed" in result.stdout
            assert f"sites on Ray cluster {cluster.address}" in result.stdout
            state = cluster.state()
            assert state["nodes"] == 2
            drivers = [job for job in state["jobs"] if "flwr-simulation" in job]
            assert len(drivers) == 1, state["jobs"]
        finally:
            cluster.stop()
        assert cluster.processes() == []
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def _simulate_command(tmp_path: Path, data_root: Path, address: str) -> list[str]:
    return [
        sys.executable, "-m", "app.tooling.simulate", "--data-root", str(data_root),
        "--sites", "2", "--ray-address", address,
        "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
        "--artifact-root", str(tmp_path / "artifacts"),
        "--flwr-home", str(tmp_path / "flwr-home"), "--log-dir", str(tmp_path / "logs"),
        "--timeout", "300", "-c", "task=cxr-cls", "-c", "num-server-rounds=1",
        "-c", "local-steps=1", "-c", "image-size=32", "-c", "batch-size=4",
        "-c", "final-evaluation=false",
        "-c", "experiment=ray-cluster",
    ]


def _environment() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)  # the address is given with --ray-address
    return env


def test_unreachable_ray_address_is_refused_before_anything_starts(tmp_path, capsys):
    data_root = tmp_path / "data"
    for name in ("hospital-00", "hospital-01"):
        (data_root / name).mkdir(parents=True)
    address = f"127.0.0.1:{free_port()}"
    code = simulate.main(["--data-root", str(data_root), "--sites", "2",
                          "--tracking-uri", "sqlite:///unused.db",
                          "--artifact-root", str(tmp_path / "artifacts"),
                          "--flwr-home", str(tmp_path / "flwr-home"),
                          "--log-dir", str(tmp_path / "logs"), "--ray-address", address])
    assert code == 2
    assert f"RAY_ADDRESS={address}: no Ray cluster can be reached" in capsys.readouterr().err
    assert not (tmp_path / "logs").exists()
