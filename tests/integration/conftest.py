"""Fixtures of the real-process deployment tests: a TLS SuperLink with node authentication.

``deployment`` is one SuperLink per test module (its tests start their own
SuperNodes); ``private_deployment`` is one per test, for a test that kills and
restarts its SuperLink. Every process is started by ``app.deployment`` in its
own process group and stopped by PID; at teardown no process may still name
the deployment's folder.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.certs import ensure_server_certificate, ensure_site_keys
from app.deployment import CONNECTION, DeployLayout, TLSSuperLink, write_tls_connection
from app.flower_processes import free_port

DEPLOYMENT_SITES = ("hospital-a", "hospital-b", "rogue")


@dataclass
class Deployment:
    """A running TLS SuperLink, its deployment folder and the CLI's ``FLWR_HOME``.

    ``link`` may be replaced by a test that restarts the SuperLink; teardown
    stops whichever SuperLink it holds then.
    """

    root: Path
    layout: DeployLayout
    link: TLSSuperLink
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
    link = TLSSuperLink.start(layout, host="127.0.0.1", port=free_port())
    deployment = Deployment(root, layout, link, flwr_home)
    try:
        write_tls_connection(flwr_home, CONNECTION, link.address, layout.ca_cert)
        yield deployment
    finally:
        deployment.link.stop()
    assert deployment.link.process.poll() is not None
    deadline = time.monotonic() + 20
    while processes_mentioning(str(root)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_mentioning(str(root)) == []


@pytest.fixture(scope="module")
def deployment(tmp_path_factory) -> Iterator[Deployment]:
    """One TLS SuperLink shared by the tests of a module."""
    with _running_deployment(tmp_path_factory.mktemp("deployment")) as running:
        yield running


@pytest.fixture
def private_deployment(tmp_path_factory) -> Iterator[Deployment]:
    """A TLS SuperLink of its own, which the test may kill and restart."""
    with _running_deployment(tmp_path_factory.mktemp("private-deployment")) as running:
        yield running
