"""What every page of the console shares: the request guard, page rendering, forms.

:func:`guard` is the console's one middleware: it rejects a ``Host`` that is not the
console's own (DNS rebinding), gives every browser a signed session, refuses a POST
whose ``Origin`` / ``Referer`` is another site's, sends a session that has not logged
in with the admin token to the login form (a GET) or refuses it (any other method:
nothing changes without the token, on loopback too), and adds the security headers
(:mod:`app.site_runtime.console_access`). :func:`page` renders a template with what
the layout needs (site, nav, CSRF token, the audit chain's alert, a signed result
message); :func:`read_form` parses a urlencoded POST (no multipart library) and
checks its CSRF token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import HTTPException, Request
from fastapi.responses import RedirectResponse, Response

from app.site_runtime.console_access import (CSRF_FIELD, SESSION_SECONDS, ConsoleSettings,
                                             Session, request_origin_ok)
from app.site_runtime.console_pages import chain_banner
from clients.site.policy import SitePolicy, load_policy
from strategies.wire.errors import FedMedError

__all__ = ["MAX_FORM_BYTES", "TEMPLATES", "current_policy", "error_page", "guard", "local_path",
           "read_form", "render", "set_session"]

TEMPLATES = Path(__file__).with_name("console_templates")
#: The largest form body accepted (bytes).
MAX_FORM_BYTES = 64 * 1024
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; base-uri 'none'; form-action 'self'; "
                               "frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
_OPEN_PATHS = ("/login", "/static/console.css")


def current_policy(settings: ConsoleSettings) -> tuple[SitePolicy | None, str]:
    """``(the policy in force, "")``, or ``(None, why it cannot be read)``: never a 500."""
    try:
        return load_policy(settings.policy_path), ""
    except FedMedError as exc:
        return None, str(exc)


def error_page(request: Request, status: int, text: str) -> Response:
    """The error page: ``text`` in a red banner, never a stack trace."""
    return render(request, "error.html", status=status, message=text, page="error")


def render(request: Request, name: str, status: int = 200, **context: Any) -> Response:
    """Template ``name`` with the layout's context (site, CSRF token, chain alert, message,
    and whether the policy runs the app outside the sandbox: a red banner on every page)."""
    state = request.app.state
    session = getattr(request.state, "session", None)
    _, _, chain = state.audit.snapshot()
    context.setdefault("page", name.removesuffix(".html"))
    policy, _ = current_policy(state.settings)
    return state.templates.TemplateResponse(request, name, {
        "site": state.settings.site, "chain_alert": chain_banner(chain),
        "dataset_names": dict(state.settings.datasets),
        "unsandboxed": policy is not None and policy.sandbox == "off",
        "csrf": state.signer.csrf_token(session) if session else "",
        "logged_in": bool(session and session.admin),
        "flash": _flash(request), **context}, status_code=status)


def _flash(request: Request) -> str:
    """The result message of the last action, when the console itself signed it."""
    text, mac = request.query_params.get("done", ""), request.query_params.get("mac", "")
    return text if text and request.app.state.signer.text_ok(text, mac) else ""


async def read_form(request: Request) -> dict[str, str]:
    """The urlencoded form of a POST, after its CSRF token is checked (403 if wrong)."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise HTTPException(413, f"form over {MAX_FORM_BYTES} bytes")
    fields = {key: values[-1] for key, values in
              parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True).items()}
    session = request.state.session
    if not request.app.state.signer.csrf_ok(session, fields.get(CSRF_FIELD, "")):
        raise HTTPException(403, "the form's CSRF token is missing or stale: reload the page "
                                 "and try again; nothing was changed")
    return fields


def local_path(target: str) -> str:
    """``target`` when it is a path of this console (never another site: no open redirect)."""
    if not target.startswith("/") or target[1:2] in ("/", "\\") or any(
            c in target for c in "\r\n"):
        return "/"
    return target


def set_session(response: Response, request: Request, session: Session) -> None:
    """Give the browser ``session``: HttpOnly, SameSite=Strict, Secure under TLS."""
    response.set_cookie(request.app.state.settings.cookie_name,
                        request.app.state.signer.dump(session),
                        max_age=SESSION_SECONDS, httponly=True, samesite="strict",
                        secure=request.app.state.settings.tls, path="/")


async def guard(request: Request, call_next: Any) -> Response:
    """Host check, session, origin check of every POST, the admin login, security headers."""
    state = request.app.state
    settings: ConsoleSettings = state.settings
    session = state.signer.load(request.cookies.get(settings.cookie_name))
    fresh = session is None
    request.state.session = session = session or state.signer.new(admin=False)
    if request.headers.get("host", "").lower() not in settings.own_hosts():
        response = Response("unknown Host header: the console answers only by its own address",
                            status_code=400, media_type="text/plain")
    elif request.method not in ("GET", "HEAD") and not request_origin_ok(
            settings, request.headers.get("origin"), request.headers.get("referer")):
        response = error_page(request, 403, "this form was not sent from the console's own "
                                            "pages (Origin/Referer check); nothing was changed")
    elif not session.admin and request.url.path not in _OPEN_PATHS:
        response = (RedirectResponse(f"/login?next={quote(request.url.path)}", status_code=303)
                    if request.method in ("GET", "HEAD") else
                    error_page(request, 403, "log in with the admin token first"))
    else:
        response = await call_next(request)
    if fresh and "set-cookie" not in response.headers:
        set_session(response, request, session)
    for name, value in _SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response
