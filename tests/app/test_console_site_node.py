"""``make supernode CONSOLE=1``: the site node serves the console in its own process, with
an admin token it makes at its first start (mode 0600, in ``<state>/console/``)."""

from __future__ import annotations

import importlib
import socket
import stat
import time

import httpx
import pytest

from app.site_runtime import site_node
from app.site_runtime.console_access import CONSOLE_DIR, TOKEN_NAME
from tests.app.console_site import log_in
from tests.app.test_site_runner_policy import PERMISSIVE, no_supernode  # noqa: F401


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_site_node_serves_the_console_until_it_stops(no_supernode, monkeypatch,  # noqa: F811
                                                         tmp_path, caplog):
    port = _free_port()
    origin = f"http://127.0.0.1:{port}"
    token = tmp_path / "state" / CONSOLE_DIR / TOKEN_NAME
    seen: dict[str, httpx.Response] = {}

    def supernode() -> None:  # runs while the node would serve its SuperNode
        with httpx.Client(base_url=origin, timeout=5) as client:
            for _ in range(300):
                try:
                    seen["anonymous"] = client.get("/")
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            seen["overview"] = log_in(client, token, origin).get("/")

    cli = importlib.import_module("flwr.supernode.cli.flower_supernode")
    monkeypatch.setattr(cli, "flower_supernode", supernode)
    config = (f'data-path="{tmp_path / "site"}" state-dir="{tmp_path / "state"}" '
              f'site-name="hospital-h" policy-path="{PERMISSIVE}"')
    site_node.main(["--policy", str(PERMISSIVE), "--console-port", str(port), "--",
                    "--port", "9", "--node-config", config])
    assert seen["anonymous"].status_code == 303
    assert seen["anonymous"].headers["location"] == "/login?next=/"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert stat.S_IMODE(token.parent.stat().st_mode) == 0o700
    secret = token.read_text(encoding="utf-8").strip()
    assert len(secret) >= 32 and secret not in caplog.text
    assert f"admin token in {token} (made now, mode 0600)" in caplog.text
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
