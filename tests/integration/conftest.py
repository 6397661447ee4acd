"""Fixtures of the real-process tests: small synthetic hospitals, a TLS SuperLink.

``small_hospitals`` writes synthetic hospitals (32x32) cut to four studies each
(two train, one val, one test): a federation of real DICOM series and NIfTI masks that
trains and evaluates in seconds. ``deployment`` is one TLS SuperLink with
SuperNode authentication for the whole session (its tests start their own
SuperNodes); ``private_deployment`` is one per test, for a test that kills and
restarts its SuperLink. Every process is started by ``app.tooling`` in its
own process group and stopped by PID; at teardown no process may still name
the deployment's folder.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.tooling.certs import ensure_server_certificate, ensure_site_keys
from app.tooling.environment import free_port
from app.tooling.flwr_cli import CONNECTION, write_connection
from app.tooling.layout import DeployLayout
from app.tooling.superlink import SuperLinkProcess
from clients.pe_seg.manifest import read_manifest, write_manifest
from clients.pe_seg.synthetic import generate_federation
from tests.integration.wheel_venv import WheelVenv, build_wheel_venv

DEPLOYMENT_SITES = ("hospital-a", "hospital-b", "rogue")


def write_small_hospitals(root: Path, seed: int, num_sites: int = 2) -> list[Path]:
    """Synthetic hospitals (32x32) cut to four studies each: two train, one val, one test."""
    sites = generate_federation(root, num_sites=num_sites, seed=seed, image_size=32)
    for site in sites:
        entries = read_manifest(site)
        keep = ([e for e in entries if e.split == "train"][:2]
                + [e for e in entries if e.split == "val"][:1]
                + [e for e in entries if e.split == "test"][:1])
        write_manifest(site, keep)
    return sites


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory) -> WheelVenv:
    """A fresh venv with the fedmed wheel installed from a local wheelhouse (built once)."""
    return build_wheel_venv(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def small_hospitals() -> Callable[[Path, int], list[Path]]:
    """``write(root, seed)``: two small synthetic hospitals under ``root``."""
    return write_small_hospitals


@dataclass
class Deployment:
    """A running TLS SuperLink, its deployment folder and the CLI's ``FLWR_HOME``.

    ``link`` may be replaced by a test that restarts the SuperLink; teardown
    stops whichever SuperLink it holds then.
    """

    root: Path
    layout: DeployLayout
    link: SuperLinkProcess
    flwr_home: Path


def processes_mentioning(text: str) -> list[str]:
    """Command lines of the running processes that contain ``text``."""
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if text in line]


@contextmanager
def _running_deployment(root: Path) -> Iterator[Deployment]:
    layout = DeployLayout(root / "deploy")
    ensure_server_certificate(layout.certs, "localhost,127.0.0.1")
    for site in DEPLOYMENT_SITES:
        ensure_site_keys(layout.certs, site)
    flwr_home = root / "flwr-cli"
    link = SuperLinkProcess.start_tls(layout, host="127.0.0.1", port=free_port(),
                                     startup_timeout=300)
    deployment = Deployment(root, layout, link, flwr_home)
    try:
        write_connection(flwr_home, CONNECTION, link.address, layout.ca_cert)
        yield deployment
    finally:
        deployment.link.stop()
    assert deployment.link.process.poll() is not None
    deadline = time.monotonic() + 20
    while processes_mentioning(str(root)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_mentioning(str(root)) == []


@pytest.fixture(scope="session")
def deployment(tmp_path_factory) -> Iterator[Deployment]:
    """One TLS SuperLink shared by the deployment tests of the session."""
    with _running_deployment(tmp_path_factory.mktemp("deployment")) as running:
        yield running


@pytest.fixture
def private_deployment(tmp_path_factory) -> Iterator[Deployment]:
    """A TLS SuperLink of its own, which the test may kill and restart."""
    with _running_deployment(tmp_path_factory.mktemp("private-deployment")) as running:
        yield running
