"""Upgrade: this release's SuperLink starts on databases an older release wrote (#47 item 6).

Two fixtures (tests/fixtures/releases/README.md): the ``state.db`` of release 054dc2f's
TLS deployment after a federation (Flower 1.42.0), and one written by Flower 1.41.0's own
SuperLink with two registered SuperNode keys, which Flower's alembic revisions migrate
when this release's SuperLink opens it. Each copy gets fresh certificates (TLS files are
not part of the database); both SuperLinks start at once (about 20 s on 2 loaded cores).
No federation runs here: tests/app/test_release_upgrade.py reads the rest of the fixture.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from app.tooling.certs import ensure_server_certificate
from app.tooling.flwr_cli import CONNECTION, list_supernodes, run_status, write_connection
from app.tooling.layout import DeployLayout
from app.tooling.superlink import SuperLinkProcess

pytestmark = pytest.mark.integration

RELEASES = Path(__file__).resolve().parents[1] / "fixtures" / "releases"


def _revision(db: Path) -> str:
    connection = sqlite3.connect(db)
    try:
        return str(connection.execute("SELECT version_num FROM alembic_version").fetchone()[0])
    finally:
        connection.close()


def _deployment(root: Path, db: Path, registry: Path | None) -> tuple[DeployLayout, Path]:
    """A deployment folder holding a copy of ``db`` (and ``registry``), fresh certificates."""
    layout = DeployLayout(root / "deploy")
    layout.superlink_dir.mkdir(parents=True)
    shutil.copy2(db, layout.superlink_dir / "state.db")
    if registry is not None:
        shutil.copy2(registry, layout.registry)
    ensure_server_certificate(layout.certs, "localhost,127.0.0.1")
    return layout, root / "flwr-cli"


def test_this_superlink_lists_what_older_releases_registered_and_ran(tmp_path):
    old_release = json.loads((RELEASES / "054dc2f" / "expected.json").read_text())
    old_flower = json.loads((RELEASES / "flwr-1.41.0" / "expected.json").read_text())
    deployments = {
        "054dc2f": _deployment(tmp_path / "054dc2f", RELEASES / "054dc2f" / "superlink" /
                               "state.db", RELEASES / "054dc2f" / "superlink" / "sites.json"),
        "flwr-1.41.0": _deployment(tmp_path / "flwr-1.41.0",
                                   RELEASES / "flwr-1.41.0" / "state.db", None)}
    head = _revision(RELEASES / "054dc2f" / "superlink" / "state.db")  # Flower 1.42.0's
    assert _revision(RELEASES / "flwr-1.41.0" / "state.db") != head
    with ThreadPoolExecutor(max_workers=2) as pool:
        started = {name: pool.submit(SuperLinkProcess.start_tls, layout, "127.0.0.1", None, 300)
                   for name, (layout, _) in deployments.items()}
        links = {}
        for name, future in started.items():
            try:
                links[name] = future.result()
            except Exception:  # noqa: BLE001 - stop the other one, then fail
                for link in links.values():
                    link.stop()
                raise
    try:
        for name, link in links.items():
            layout, flwr_home = deployments[name]
            write_connection(flwr_home, CONNECTION, link.address, layout.ca_cert)
        nodes = {name: {n["node-id"]: n["status"] for n in list_supernodes(home)}
                 for name, (_, home) in deployments.items()}
        status = run_status(deployments["054dc2f"][1], CONNECTION,
                            old_release["run"]["run-id"])
    finally:
        for link in links.values():
            link.stop()
    # Release 054dc2f: its two hospitals (stopped since) and its completed run.
    assert sorted(nodes["054dc2f"]) == old_release["listed-node-ids"]
    assert set(nodes["054dc2f"].values()) <= {"registered", "offline"}, nodes
    assert status == old_release["run"]["status"] == "finished:completed"
    # Flower 1.41.0: the two keys it registered, migrated to this Flower's schema.
    assert nodes["flwr-1.41.0"] == {str(i): "registered"
                                    for i in old_flower["node-ids"].values()}
    assert nodes["flwr-1.41.0"] == old_flower["listed"]
    for name, (layout, _) in deployments.items():
        assert _revision(layout.superlink_dir / "state.db") == head, name
