"""``make supernode CONSOLE=1``: the site node serves the console in its own process."""

from __future__ import annotations

import importlib
import socket
import time

import httpx
import pytest

from app.site_runtime import site_node
from tests.app.test_site_runner_policy import PERMISSIVE, no_supernode  # noqa: F401


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_site_node_serves_the_console_until_it_stops(no_supernode, monkeypatch,  # noqa: F811
                                                         tmp_path):
    port = _free_port()
    seen: dict[str, httpx.Response] = {}

    def supernode() -> None:  # runs while the node would serve its SuperNode
        for _ in range(300):
            try:
                seen["overview"] = httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
                return
            except httpx.TransportError:
                time.sleep(0.1)

    cli = importlib.import_module("flwr.supernode.cli.flower_supernode")
    monkeypatch.setattr(cli, "flower_supernode", supernode)
    config = (f'data-path="{tmp_path / "site"}" state-dir="{tmp_path / "state"}" '
              f'site-name="hospital-h" policy-path="{PERMISSIVE}"')
    site_node.main(["--policy", str(PERMISSIVE), "--console-port", str(port), "--",
                    "--port", "9", "--node-config", config])
    assert seen["overview"].status_code == 200
    assert 'id="site-name">hospital-h<' in seen["overview"].text
    for _ in range(300):  # the node stopped: so does its console
        try:
            httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
        except httpx.TransportError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the console still answers after the node stopped")
