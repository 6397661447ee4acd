"""The console always needs its admin token (issue 44, found item 3).

Before, a console started without ``--admin-token-file`` on loopback (as the node's own,
``make supernode CONSOLE=1``, always was) had no token: a local script read the CSRF
token from a page, posted with a matching ``Origin`` and approved an arbitrary app.
Now a token is made at the first start (``<state>/console/admin-token``, mode 0600),
reused afterwards, and nothing that changes state is accepted without a login with it.
"""

from __future__ import annotations

import logging
import socket
import stat
import threading

import httpx
import pytest
from fastapi.testclient import TestClient

from app.site_runtime.audit_log import AuditLog
from app.site_runtime.console import create_console, serve_console, start_console_thread
from app.site_runtime.console_access import (CONSOLE_DIR, TOKEN_NAME, ConsoleSettings,
                                             admin_token_path)
from clients.site.policy import load_policy
from strategies.wire.errors import ConfigError
from tests.app.console_site import csrf_of, log_in, site_folder

DIGEST = "d" * 64
BASE = "http://127.0.0.1:8470"
_CHANGING = {"POST", "PUT", "PATCH", "DELETE"}


@pytest.fixture
def site(tmp_path):
    """``(state dir, policy file)`` of a site whose console never started."""
    return site_folder(tmp_path)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _approvals(state) -> list[dict]:
    return [r for r in AuditLog(state).records() if r.get("kind") == "app-approved"]


def test_a_local_script_without_the_token_cannot_approve_an_app(site):
    """The reviewer's script: GET a page, take its CSRF token, POST an approval with the
    console's own Origin, no admin token. Refused, and the policy is unchanged."""
    state, policy = site
    before = policy.read_bytes()
    settings = ConsoleSettings("hospital-a", state, policy, port=_free_port())
    origin = f"http://127.0.0.1:{settings.port}"
    stop = threading.Event()
    server = threading.Thread(target=serve_console, args=(settings, stop), daemon=True)
    server.start()
    try:
        with httpx.Client(base_url=origin, timeout=5, follow_redirects=True) as script:
            for _ in range(300):
                try:
                    page = script.get("/apps")
                    break
                except httpx.TransportError:
                    server.join(0.1)
            form = {"csrf": csrf_of(page.text), "action": "approve", "app": DIGEST,
                    "fingerprint": load_policy(policy).fingerprint, "reason": "script"}
            answer = script.post("/apps/apply", data=form, headers={"Origin": origin},
                                 follow_redirects=False)
    finally:
        stop.set()
        server.join(30)
    assert answer.status_code == 403 and "admin token" in answer.text
    assert policy.read_bytes() == before
    assert DIGEST not in load_policy(policy).apps.approved_sha256
    assert _approvals(state) == []


def test_no_state_changing_route_is_accepted_without_a_login(site):
    """Every POST / PUT / PATCH / DELETE route but the login itself, on loopback, with a
    valid CSRF token and Origin: 403 and nothing changed; after the login it works."""
    state, policy = site
    before = policy.read_bytes()
    settings = ConsoleSettings("hospital-a", state, policy)
    app = create_console(settings)
    routes = sorted((method, route.path) for route in app.routes
                    for method in getattr(route, "methods", set()) & _CHANGING)
    assert ("POST", "/apps/apply") in routes and ("POST", "/apps/confirm") in routes
    client = TestClient(app, base_url=BASE, client=("127.0.0.1", 40000))
    csrf = csrf_of(client.get("/login").text)
    form = {"csrf": csrf, "action": "approve", "app": DIGEST, "fingerprint": "", "reason": "x"}
    for method, path in routes:
        if path == "/login":
            continue
        answer = client.request(method, path, data=form, headers={"Origin": BASE})
        assert answer.status_code == 403, (method, path)
        assert "log in with the admin token" in answer.text, (method, path)
    assert policy.read_bytes() == before and _approvals(state) == []
    log_in(client, settings.admin_token_file, BASE)
    form["csrf"] = csrf_of(client.get("/apps").text)
    done = client.post("/apps/apply", data=form, headers={"Origin": BASE},
                       follow_redirects=False)
    assert done.status_code == 303
    assert DIGEST in load_policy(policy).apps.approved_sha256
    assert [r["app"] for r in _approvals(state)] == [DIGEST]


def test_the_first_start_makes_a_private_token_and_later_starts_keep_it(site):
    state, policy = site
    first = ConsoleSettings("hospital-a", state, policy)
    path = state / CONSOLE_DIR / TOKEN_NAME
    assert first.admin_token_file == path == admin_token_path(state)
    assert first.admin_token_made and first.admin_token_note == "made now, mode 0600"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert len(first.admin_token) >= 43  # secrets.token_urlsafe(32)
    assert first.admin_token not in repr(first)
    assert sorted(p.name for p in path.parent.iterdir()) == [TOKEN_NAME]  # no temporary left
    again = ConsoleSettings("hospital-a", state, policy, port=8471)
    assert again.admin_token == first.admin_token and not again.admin_token_made
    assert again.admin_token_note == "kept from an earlier start"


def test_consoles_starting_together_share_one_token(site):
    state, policy = site
    ready = threading.Barrier(8)
    tokens: list[str] = []

    def start() -> None:
        ready.wait()
        tokens.append(ConsoleSettings("hospital-a", state, policy).admin_token)

    threads = [threading.Thread(target=start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(tokens) == 8 and len(set(tokens)) == 1
    assert admin_token_path(state).read_text(encoding="utf-8").strip() == tokens[0]


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o644])
def test_a_token_file_others_may_read_is_refused_naming_it(site, tmp_path, mode):
    state, policy = site
    made = ConsoleSettings("hospital-a", state, policy).admin_token_file
    made.chmod(mode)
    with pytest.raises(ConfigError, match=rf"admin token {made}: mode {mode:04o} .*chmod 600"):
        ConsoleSettings("hospital-a", state, policy)
    given = tmp_path / "given-token"
    given.write_text("a-token-the-hospital-chose\n")
    given.chmod(mode)
    with pytest.raises(ConfigError, match=rf"--admin-token-file {given}: mode {mode:04o}"):
        ConsoleSettings("hospital-a", state, policy, admin_token_file=given)


def test_an_admin_token_file_overrides_the_state_dirs_own(site, tmp_path):
    """``make console ADMIN_TOKEN_FILE=``: that file's token, and none made in the state dir."""
    state, policy = site
    given = tmp_path / "given-token"
    given.write_text("a-token-the-hospital-chose\n")
    given.chmod(0o600)
    settings = ConsoleSettings("hospital-a", state, policy, admin_token_file=given)
    assert settings.admin_token == "a-token-the-hospital-chose"
    assert settings.admin_token_note == "given with --admin-token-file"
    assert not (state / CONSOLE_DIR).exists()


def test_refused_settings_make_no_token(site):
    state, policy = site
    with pytest.raises(ConfigError, match="--tls-cert"):
        ConsoleSettings("hospital-a", state, policy, host="10.0.0.5")
    assert not (state / CONSOLE_DIR).exists()


def test_the_console_logs_where_the_token_is_never_the_token(site, caplog):
    state, policy = site
    caplog.set_level(logging.WARNING, logger="fedmed.console")
    with socket.socket() as taken:  # the console logs its start, then cannot bind and ends
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        settings = ConsoleSettings("hospital-a", state, policy, port=taken.getsockname()[1])
        thread = start_console_thread(settings, threading.Event())
        thread.join(60)
    assert not thread.is_alive()
    assert f"admin token in {settings.admin_token_file} (made now, mode 0600)" in caplog.text
    assert settings.admin_token not in caplog.text
