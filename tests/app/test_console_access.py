"""Who may reach the console: the bind rule, the admin token login, sessions, CSRF, headers.

The admin token's file itself (made at the first start, mode 0600, reused, refused when
others may read it) and the found item's script: tests/app/test_console_admin_token.py.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from app.site_runtime.console import create_console, main, serve_console, start_console_thread
from app.site_runtime.console_access import (SESSION_COOKIE, SESSION_SECONDS, ConsoleSettings,
                                             SessionSigner, is_loopback)
from app.tooling.certs import cert_paths, ensure_server_certificate
from clients.site.policy import load_policy
from strategies.wire.errors import ConfigError
from tests.app.console_site import csrf_of, log_in, site_folder

BASE = "http://127.0.0.1:8470"
TOKEN = "correct-horse-battery-staple"
DIGEST = "c" * 64


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, Path]:
    state, policy = site_folder(tmp_path)
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    for name in ("cert.pem", "key.pem"):
        (tmp_path / name).write_text("placeholder: only its existence is checked here\n")
    return {"state": state, "policy": policy, "token": token, "cert": tmp_path / "cert.pem",
            "key": tmp_path / "key.pem"}


def client_of(settings: ConsoleSettings, host: str = "127.0.0.1") -> TestClient:
    """A client of the console that has not logged in."""
    return TestClient(create_console(settings), base_url=BASE, client=(host, 40000))


def admin_of(settings: ConsoleSettings, host: str = "127.0.0.1") -> TestClient:
    """A client of the console logged in with its admin token."""
    return log_in(client_of(settings, host), settings.admin_token_file, BASE)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.5", "[::1]"])
def test_loopback_names(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.5", "console.hospital.org", "::"])
def test_other_addresses_are_not_loopback(host):
    assert not is_loopback(host)


def test_a_missing_state_dir_or_policy_names_the_option(paths, tmp_path):
    with pytest.raises(ConfigError, match="--state .*no such folder"):
        ConsoleSettings("a", tmp_path / "nowhere", paths["policy"])
    with pytest.raises(ConfigError, match="--policy .*no such file"):
        ConsoleSettings("a", paths["state"], tmp_path / "none.toml")


def test_off_loopback_tls_is_required(paths):
    with pytest.raises(ConfigError, match="--host 10.0.0.5 is not loopback: --tls-cert"):
        ConsoleSettings("a", paths["state"], paths["policy"], host="10.0.0.5",
                        admin_token_file=paths["token"])


def test_a_cert_without_its_key_is_refused(paths):
    with pytest.raises(ConfigError, match="--tls-key"):
        ConsoleSettings("a", paths["state"], paths["policy"], tls_cert=paths["cert"])


def test_off_loopback_with_tls_and_token_is_accepted(paths):
    settings = ConsoleSettings("a", paths["state"], paths["policy"], host="10.0.0.5", port=8443,
                               tls_cert=paths["cert"], tls_key=paths["key"],
                               admin_token_file=paths["token"])
    assert settings.own_origins() == {"https://10.0.0.5:8443"}
    assert settings.admin_token == TOKEN


def test_off_loopback_without_a_token_file_the_state_dirs_own_is_made(paths):
    settings = ConsoleSettings("a", paths["state"], paths["policy"], host="10.0.0.5",
                               tls_cert=paths["cert"], tls_key=paths["key"])
    assert settings.admin_token_made and len(settings.admin_token) >= 16
    assert settings.admin_token_file == paths["state"] / "console" / "admin-token"


def test_a_wildcard_address_needs_the_origin_browsers_use(paths):
    tls = {"tls_cert": paths["cert"], "tls_key": paths["key"], "admin_token_file": paths["token"]}
    with pytest.raises(ConfigError, match="--origin"):
        ConsoleSettings("a", paths["state"], paths["policy"], host="0.0.0.0", **tls)
    settings = ConsoleSettings("a", paths["state"], paths["policy"], host="0.0.0.0",
                               origins=("https://Console.Hospital.org:8470",), **tls)
    assert settings.own_origins() == {"https://console.hospital.org:8470"}


def test_a_short_admin_token_is_refused(paths):
    paths["token"].write_text("short")
    with pytest.raises(ConfigError, match="--admin-token-file .*at least 16"):
        ConsoleSettings("a", paths["state"], paths["policy"], admin_token_file=paths["token"])


def test_sessions_are_signed_and_expire():
    signer = SessionSigner()
    session = signer.new(admin=True)
    cookie = signer.dump(session)
    assert signer.load(cookie) == session
    assert signer.load(cookie.replace(".1.", ".0.")) is None
    assert signer.load(SessionSigner().dump(session)) is None  # another console's key
    assert signer.load(cookie, now=session.issued + SESSION_SECONDS + 1) is None
    assert signer.csrf_ok(session, signer.csrf_token(session))
    assert not signer.csrf_ok(signer.new(admin=True), signer.csrf_token(session))


def test_security_headers_and_cookie_flags(paths):
    response = client_of(ConsoleSettings("a", paths["state"], paths["policy"])).get("/login")
    assert response.headers["content-security-policy"].startswith("default-src 'self'")
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["referrer-policy"] == "same-origin"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}_8470=") and "HttpOnly" in cookie
    assert "SameSite=strict" in cookie or "SameSite=Strict" in cookie


def _revoke_form(client: TestClient, **overrides: str) -> dict[str, str]:
    form = {"csrf": csrf_of(client.get("/apps").text), "action": "revoke", "app": DIGEST,
            "fingerprint": "", "reason": "test"}
    return {**form, **overrides}


def test_a_post_without_the_csrf_token_changes_nothing(paths):
    client = admin_of(ConsoleSettings("a", paths["state"], paths["policy"]))
    before = paths["policy"].read_text()
    form = _revoke_form(client, csrf="0" * 64)
    response = client.post("/apps/apply", data=form, headers={"Origin": BASE})
    assert response.status_code == 403 and "CSRF" in response.text
    form.pop("csrf")
    assert client.post("/apps/apply", data=form, headers={"Origin": BASE}).status_code == 403
    assert paths["policy"].read_text() == before


def test_a_post_from_another_origin_changes_nothing(paths):
    client = admin_of(ConsoleSettings("a", paths["state"], paths["policy"]))
    before = paths["policy"].read_text()
    form = _revoke_form(client)
    for headers in ({"Origin": "http://evil.example"}, {"Origin": "null"}, {},
                    {"Referer": "http://evil.example/apps"}):
        response = client.post("/apps/apply", data=form, headers=headers)
        assert response.status_code == 403, headers
    assert paths["policy"].read_text() == before
    response = client.post("/apps/apply", data=form, headers={"Referer": BASE + "/apps"},
                           follow_redirects=False)
    assert response.status_code == 303
    assert DIGEST in load_policy(paths["policy"]).apps.revoked_sha256


def test_an_unknown_host_header_is_refused(paths):
    client = admin_of(ConsoleSettings("a", paths["state"], paths["policy"]))
    assert client.get("/", headers={"Host": "rebound.example:8470"}).status_code == 400
    assert client.get("/", headers={"Host": "localhost:8470"}).status_code == 200


def test_with_a_given_token_pages_need_a_login(paths):
    settings = ConsoleSettings("a", paths["state"], paths["policy"],
                               admin_token_file=paths["token"])
    client = client_of(settings)
    response = client.get("/activity", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/login?next=/activity"
    login = client.get("/login").text
    wrong = client.post("/login", data={"csrf": csrf_of(login), "token": "x" * 20,
                                        "next": "/activity"}, headers={"Origin": BASE})
    assert wrong.status_code == 403 and 'id="login-error"' in wrong.text
    assert client.get("/activity", follow_redirects=False).status_code == 303
    right = client.post("/login", data={"csrf": csrf_of(login), "token": TOKEN,
                                        "next": "/activity"}, headers={"Origin": BASE},
                        follow_redirects=False)
    assert right.status_code == 303 and right.headers["location"] == "/activity"
    assert "HttpOnly" in right.headers["set-cookie"]
    assert client.get("/activity").status_code == 200
    out = client.post("/logout", data={"csrf": csrf_of(client.get("/").text)},
                      headers={"Origin": BASE}, follow_redirects=False)
    assert out.status_code == 303
    assert client.get("/activity", follow_redirects=False).status_code == 303


def test_with_a_given_token_a_post_before_login_is_refused(paths):
    settings = ConsoleSettings("a", paths["state"], paths["policy"],
                               admin_token_file=paths["token"])
    client = client_of(settings)
    csrf = csrf_of(client.get("/login").text)
    response = client.post("/apps/apply", data={"csrf": csrf, "action": "revoke",
                                                "app": DIGEST}, headers={"Origin": BASE})
    assert response.status_code == 403
    assert DIGEST not in load_policy(paths["policy"]).apps.revoked_sha256


def test_the_data_page_is_served_to_loopback_clients_only(paths):
    settings = ConsoleSettings("a", paths["state"], paths["policy"])
    assert admin_of(settings, host="127.0.0.1").get("/data").status_code == 200
    remote = admin_of(settings, host="10.1.2.3")
    response = remote.get("/data")
    assert response.status_code == 403 and "may name the site" in response.text
    assert remote.get("/activity").status_code == 200
    proxied = admin_of(settings).get("/data", headers={"X-Forwarded-For": "10.1.2.3"})
    assert proxied.status_code == 403


def test_an_internal_error_shows_no_stack_trace(paths, monkeypatch):
    def broken(state_dir):
        raise RuntimeError("boom in /secret/site/path")

    monkeypatch.setattr("app.site_runtime.console.data_reports", broken)
    settings = ConsoleSettings("a", paths["state"], paths["policy"])
    client = log_in(TestClient(create_console(settings), base_url=BASE,
                               raise_server_exceptions=False, client=("127.0.0.1", 40000)),
                    settings.admin_token_file, BASE)
    response = client.get("/data")
    assert response.status_code == 500 and "RuntimeError" in response.text
    assert "Traceback" not in response.text and "/secret/site/path" not in response.text


def test_under_tls_the_session_cookie_is_secure(paths):
    settings = ConsoleSettings("a", paths["state"], paths["policy"], tls_cert=paths["cert"],
                               tls_key=paths["key"])
    client = TestClient(create_console(settings), base_url="https://127.0.0.1:8470")
    assert "Secure" in client.get("/login").headers["set-cookie"]


@pytest.mark.parametrize("target", ["//evil.example/x", "/\\evil.example", "https://evil.example",
                                    "/apps\r\nSet-Cookie: x=1"])
def test_the_login_goes_back_to_console_pages_only(paths, target):
    settings = ConsoleSettings("a", paths["state"], paths["policy"],
                               admin_token_file=paths["token"])
    client = client_of(settings)
    csrf = csrf_of(client.get("/login").text)
    response = client.post("/login", data={"csrf": csrf, "token": TOKEN, "next": target},
                           headers={"Origin": BASE}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/"


def test_a_bad_query_value_is_an_error_page_not_json(paths):
    client = admin_of(ConsoleSettings("a", paths["state"], paths["policy"]))
    response = client.get("/activity", params={"page": "many"})
    assert response.status_code == 400 and 'id="error-message"' in response.text


def test_the_command_line_refuses_bad_settings_naming_the_option(paths, tmp_path, capsys):
    assert main(["--site", "a", "--state", str(tmp_path / "none"),
                 "--policy", str(paths["policy"])]) == 2
    assert "--state" in capsys.readouterr().err
    assert main(["--site", "a", "--state", str(paths["state"]), "--policy", str(paths["policy"]),
                 "--host", "192.168.1.20"]) == 2
    assert "--tls-cert is required" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def _serving(settings: ConsoleSettings, probe: Callable[[], httpx.Response]) -> Iterator[None]:
    """Run :func:`serve_console` in a thread until the block ends; wait until it answers."""
    stop = threading.Event()
    server = threading.Thread(target=serve_console, args=(settings, stop), daemon=True)
    server.start()
    for _ in range(300):
        try:
            probe()
            break
        except httpx.TransportError:
            server.join(0.1)
    try:
        yield
    finally:
        stop.set()
        server.join(30)
    assert not server.is_alive()


def test_serve_console_answers_over_http_until_stopped(paths):
    settings = ConsoleSettings("a", paths["state"], paths["policy"], port=_free_port())
    origin = f"http://127.0.0.1:{settings.port}"
    with httpx.Client(base_url=origin, timeout=5) as client, \
            _serving(settings, lambda: httpx.get(origin + "/login", timeout=5)):
        first = client.get("/policy")
        assert first.status_code == 303 and first.headers["location"] == "/login?next=/policy"
        response = log_in(client, settings.admin_token_file, origin).get("/policy")
    assert response.status_code == 200 and 'id="policy-fingerprint"' in response.text


def test_serve_console_over_tls_with_the_admin_token(paths, tmp_path):
    ensure_server_certificate(tmp_path / "certs", "127.0.0.1,localhost")
    certs = cert_paths(tmp_path / "certs")
    settings = ConsoleSettings("a", paths["state"], paths["policy"], port=_free_port(),
                               tls_cert=certs.server_cert, tls_key=certs.server_key,
                               admin_token_file=paths["token"])
    origin = f"https://127.0.0.1:{settings.port}"
    with httpx.Client(base_url=origin, verify=str(certs.ca_cert), timeout=5) as client, \
            _serving(settings, lambda: httpx.get(origin, verify=str(certs.ca_cert), timeout=5)):
        first = client.get("/apps")
        assert first.headers["location"] == "/login?next=/apps"
        assert "Secure" in first.headers["set-cookie"]
        login = client.get("/login")
        done = client.post("/login", data={"csrf": csrf_of(login.text), "token": TOKEN,
                                           "next": "/apps"}, headers={"Origin": origin})
        assert done.status_code == 303 and "Secure" in done.headers["set-cookie"]
        assert 'id="apps-table"' in client.get("/apps").text


def test_a_console_thread_on_a_taken_port_is_logged_and_ends(paths, caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        settings = ConsoleSettings("a", paths["state"], paths["policy"],
                                   port=taken.getsockname()[1])
        thread = start_console_thread(settings, threading.Event())
        thread.join(60)
    assert not thread.is_alive()
    assert "not served" in caplog.text
