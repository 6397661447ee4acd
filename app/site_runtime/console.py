"""The hospital's console: a web page, served by the site, that shows what left the site.

Server-rendered pages (FastAPI + Jinja2 templates in ``console_templates/``, one
stylesheet, no script). Access rules (an admin token always, made at the first start
in ``<state>/console/admin-token`` unless ``--admin-token-file`` names one; loopback by
default, TLS otherwise; CSRF on every POST; security headers):
:mod:`app.site_runtime.console_access`;
the guard, rendering and forms every page shares: :mod:`app.site_runtime.console_http`.
What each page shows: :mod:`app.site_runtime.console_pages`, ``console_apps``,
``console_privacy``; approve / revoke: :mod:`app.site_runtime.policy_edit`.

Routes and the element ids the browser tests rely on (every page: ``nav`` with links
``nav-overview`` ... ``nav-data``; ``chain-alert`` when the audit chain is broken;
``flash`` for the result of an action; every form carries the hidden ``csrf`` field)::

    GET  /              Overview: node-connected (text "connected" / "not connected"),
                        current-run, last-message, policy-in-force, counts-today
                        (count-answered, count-refused, count-failed), chain-status (class
                        ok / broken)
    GET  /policy        policy-fingerprint, policy-error, one table per section:
                        policy-rules, policy-dp, policy-secure-aggregation,
                        policy-vertical, policy-apps
    GET  /apps          apps-any, apps-table (approved digests; row app-<digest>),
                        keys-table, revoked-table (row revoked-<digest>, form
                        undo-revoke-<digest>), seen-table (row seen-<digest>, forms
                        seen-revoke-<digest> / seen-undo-revoke-<digest>), history-table
                        (row change-<seq>: time, change, app, who, reason), forms
                        revoke-<digest> (button revoke-button-<digest>),
                        approve-form (input approve-digest, button approve-button)
    POST /apps/confirm  action, app -> the confirmation page: confirm-changes (list),
                        confirm-form (input reason, button confirm-button), cancel-link
    POST /apps/apply    action (approve, revoke, undo-revoke), app, fingerprint, reason ->
                        303 to /apps (flash); the audit record's ``by``: :func:`actor`
    GET  /privacy       privacy-table (row ds-<id>; cells eps-<id>, budget-<id>,
                        left-<id>; error-<id> for an unreadable ledger), chart-<id> (inline
                        SVG), admin-log
    GET  /activity      activity-filter (filter-run, filter-type, filter-decision,
                        filter-kind, filter-button), activity-table (row row-<seq>, cells
                        classed col-<column>), csv-link, activity-count; ?page=N
    GET  /activity.csv  the filtered rows as CSV (attachment)
    GET  /data          loopback clients only, never through a proxy (else 403):
                        data-<dataset> sections,
                        split table splits-<dataset>, skipped-<dataset>
    GET  /login, POST /login (login-form, input token, button login-button),
    POST /logout (logout-button)

Every route but ``/login`` needs a session logged in with the admin token: a GET
without one is sent to ``/login?next=<path>``, any other method is refused (403).

Command line (``make console``)::

    python -m app.site_runtime.console --site NAME --state DIR --policy FILE
        [--host 127.0.0.1] [--port 8470] [--tls-cert F --tls-key F]
        [--admin-token-file F] [--origin https://name:port ...] [--audit-archive DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.site_runtime.console_access import (CONSOLE_DIR, TOKEN_NAME, ConsoleSettings,
                                             SessionSigner, is_loopback, token_ok)
from app.site_runtime.console_http import (TEMPLATES, current_policy, error_page, guard,
                                           local_path, read_form, render, set_session)
from app.site_runtime.console_apps import apps_view
from app.site_runtime.console_pages import (AuditView, activity_csv, activity_rows,
                                            chain_banner, data_reports, node_status, overview,
                                            pacs_cohorts, policy_sections)
from app.site_runtime.console_privacy import PrivacyView
from app.site_runtime.policy_edit import DONE, apply_edit, plan_edit
from clients.site.privacy_ledger import dataset_id
from strategies.wire.errors import ConfigError, FedMedError

__all__ = ["actor", "create_console", "main", "serve_console", "start_console_thread"]

log = logging.getLogger("fedmed.console")

#: Activity rows per page.
PAGE_ROWS = 200
#: How long a stop waits for open requests and keep-alive connections (seconds).
GRACE_SECONDS = 3


def actor(settings: ConsoleSettings, request: Request) -> str:
    """Who makes a console change, as the audit log records it: the admin token's id (the
    first 8 hex of its SHA-256: which token, never the token) and the client's address."""
    token_id = hashlib.sha256(settings.admin_token.encode()).hexdigest()[:8]
    host = request.client.host if request.client else "unknown client"
    return f"console admin (token {token_id}) from {host}"


def create_console(settings: ConsoleSettings) -> FastAPI:
    """The console's web application for one site (see the module docstring for routes)."""
    app = FastAPI(title=f"FedMed console: {settings.site}", docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.settings = settings
    app.state.signer = SessionSigner()
    app.state.templates = Jinja2Templates(directory=str(TEMPLATES))
    app.state.audit = AuditView(settings.state_dir, settings.audit_archive)
    app.state.privacy = PrivacyView(settings.state_dir)
    app.middleware("http")(guard)
    app.mount("/static", StaticFiles(directory=str(TEMPLATES / "static")), name="static")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return error_page(request, exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> Response:
        wrong = ", ".join(str(error.get("loc", ["?"])[-1]) for error in exc.errors())
        return error_page(request, 400, f"bad value of {wrong} in the address")

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> Response:
        log.exception("console: %s %s failed", request.method, request.url.path)
        return error_page(request, 500, f"internal error ({type(exc).__name__}); the "
                                         "console's log has the details")

    @app.get("/favicon.ico")
    def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/login", response_class=HTMLResponse)
    def login_form(request: Request, next: str = "/") -> Response:
        return render(request, "login.html", next=local_path(next), wrong=False)

    @app.post("/login")
    async def login(request: Request) -> Response:
        fields = await read_form(request)
        target = local_path(fields.get("next", "/"))
        if not token_ok(settings, fields.get("token", "")):
            log.warning("console: a login with a wrong admin token from %s",
                        request.client.host if request.client else "?")
            return render(request, "login.html", status=403, next=target, wrong=True)
        response = RedirectResponse(target, status_code=303)
        set_session(response, request, app.state.signer.new(admin=True))
        return response

    @app.post("/logout")
    async def logout(request: Request) -> Response:
        await read_form(request)
        response = RedirectResponse("/login", status_code=303)
        set_session(response, request, app.state.signer.new(admin=False))
        return response

    @app.get("/", response_class=HTMLResponse)
    def overview_page(request: Request) -> Response:
        records, read_error, chain = app.state.audit.snapshot()
        status = node_status(settings.state_dir)
        summary = overview(records)
        last = summary["last"]
        run = status.get("run") if status.get("run") is not None else (last or {}).get("run")
        policy, policy_error = current_policy(settings)
        return render(request, "overview.html", status=200, node=status, summary=summary,
                      run=run, chain=chain_banner(chain), read_error=read_error,
                      fingerprint=policy.fingerprint if policy else "", policy_error=policy_error)

    @app.get("/policy", response_class=HTMLResponse)
    def policy_page(request: Request) -> Response:
        policy, error = current_policy(settings)
        return render(request, "policy.html", policy=policy, error=error,
                      sections=policy_sections(policy) if policy else [],
                      path=str(settings.policy_path))

    @app.get("/apps", response_class=HTMLResponse)
    def apps_page(request: Request) -> Response:
        policy, error = current_policy(settings)
        records, _, _ = app.state.audit.snapshot()
        return render(request, "apps.html", error=error,
                      view=apps_view(policy.apps, records) if policy else None)

    @app.post("/apps/confirm", response_class=HTMLResponse)
    async def apps_confirm(request: Request) -> Response:
        fields = await read_form(request)
        action, digest = fields.get("action", ""), fields.get("app", "").strip().lower()
        try:
            edit = await run_in_threadpool(plan_edit, settings.policy_path, action, digest,
                                           settings.state_dir)
        except FedMedError as exc:
            return render(request, "error.html", status=400, message=str(exc))
        return render(request, "apps_confirm.html", edit=edit)

    @app.post("/apps/apply")
    async def apps_apply(request: Request) -> Response:
        fields = await read_form(request)
        action, digest = fields.get("action", ""), fields.get("app", "")
        try:
            edit = await run_in_threadpool(
                apply_edit, settings.policy_path, settings.state_dir, action, digest,
                fields.get("reason", "").strip()[:500], fields.get("fingerprint") or None,
                actor(settings, request))
        except FedMedError as exc:
            return render(request, "error.html", status=409, message=str(exc))
        done = (f"{DONE[action]} {digest[:12]}: " + "; ".join(edit.changes)) if edit.changes \
            else f"nothing to change for {digest[:12]} ({action})"
        log.warning("console: %s", done)
        return RedirectResponse("/apps?" + urlencode(
            {"done": done, "mac": app.state.signer.sign_text(done)}), status_code=303)

    @app.get("/privacy", response_class=HTMLResponse)
    def privacy_page(request: Request) -> Response:
        policy, error = current_policy(settings)
        return render(request, "privacy.html", error=error,
                      datasets=app.state.privacy.datasets(policy),
                      admin_log=app.state.privacy.admin_log())

    def _filtered(request: Request) -> tuple[list[dict[str, Any]], dict[str, str]]:
        records, _, _ = app.state.audit.snapshot()
        chosen = {key: request.query_params.get(key, "")[:200]
                  for key in ("run", "type", "decision", "kind")}
        return activity_rows(records, chosen["run"], chosen["type"], chosen["decision"],
                             chosen["kind"]), chosen

    @app.get("/activity", response_class=HTMLResponse)
    def activity_page(request: Request, page: int = 1) -> Response:
        rows, chosen = _filtered(request)
        pages = max((len(rows) + PAGE_ROWS - 1) // PAGE_ROWS, 1)
        page = min(max(page, 1), pages)
        query = urlencode({k: v for k, v in chosen.items() if v})
        shown = rows[(page - 1) * PAGE_ROWS:page * PAGE_ROWS]
        return render(request, "activity.html", rows=shown, count=len(rows), chosen=chosen,
                      page_number=page, pages=pages, query=query)

    @app.get("/activity.csv")
    def activity_export(request: Request) -> Response:
        rows, _ = _filtered(request)
        name = "".join(c if c.isalnum() or c in "-_" else "_" for c in settings.site)
        return Response(activity_csv(rows), media_type="text/csv; charset=utf-8", headers={
            "Content-Disposition": f'attachment; filename="audit-{name}.csv"'})

    @app.get("/data", response_class=HTMLResponse)
    def data_page(request: Request) -> Response:
        client = request.client.host if request.client else ""
        proxied = "forwarded" in request.headers or "x-forwarded-for" in request.headers
        if not is_loopback(client) or proxied:
            raise HTTPException(403, "the Data page is served to this machine only (loopback): "
                                     "it may name the site's files")
        return render(request, "data.html", reports=data_reports(settings.state_dir),
                      cohorts=pacs_cohorts(settings.state_dir))

    return app


def serve_console(settings: ConsoleSettings, stop: threading.Event | None = None) -> None:
    """Serve the console with uvicorn until interrupted or ``stop`` is set.

    Usable from a thread of the site node (signals are then left to the main thread).
    """
    config = uvicorn.Config(create_console(settings), host=settings.host, port=settings.port,
                            ssl_certfile=str(settings.tls_cert) if settings.tls_cert else None,
                            ssl_keyfile=str(settings.tls_key) if settings.tls_key else None,
                            log_level="warning", server_header=False, proxy_headers=False,
                            timeout_graceful_shutdown=GRACE_SECONDS)
    server = uvicorn.Server(config)
    if stop is not None:
        def watch() -> None:
            stop.wait()
            server.should_exit = True
        threading.Thread(target=watch, name="console-stop", daemon=True).start()
    log.warning("console of site %s on %s://%s:%d; log in with the admin token in %s (%s)",
                settings.site, "https" if settings.tls else "http", settings.host,
                settings.port, settings.admin_token_file, settings.admin_token_note)
    server.run()


def start_console_thread(settings: ConsoleSettings, stop: threading.Event) -> threading.Thread:
    """Serve the console in a daemon thread of this process until ``stop`` is set.

    The site node's ``--console-port`` (``make supernode CONSOLE=1``): a console that
    cannot start (its port taken) is logged and never stops the node.
    """
    def run() -> None:
        try:
            serve_console(settings, stop)
        except (SystemExit, OSError) as exc:  # uvicorn exits when it cannot bind
            log.error("console of site %s not served on %s:%d (%s)", settings.site,
                      settings.host, settings.port, exc or "address in use?")

    thread = threading.Thread(target=run, name="console", daemon=True)
    thread.start()
    return thread


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m app.site_runtime.console",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", required=True, help="the site's name")
    parser.add_argument("--state", required=True, help="the site's state dir")
    parser.add_argument("--policy", required=True, help="the site policy file")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (loopback default)")
    parser.add_argument("--port", type=int, default=8470)
    parser.add_argument("--tls-cert", help="PEM certificate (required off loopback)")
    parser.add_argument("--tls-key", help="PEM key (required off loopback)")
    parser.add_argument("--admin-token-file",
                        help="file (mode 0600) holding the admin token; default "
                             f"<state>/{CONSOLE_DIR}/{TOKEN_NAME}, made at the first start")
    parser.add_argument("--origin", action="append", default=[],
                        help="https://name:port browsers use (required for 0.0.0.0 / ::)")
    parser.add_argument("--data", action="append", default=[], metavar="NAME=/abs/folder",
                        help="a dataset's name and its data folder: the pages show the name "
                             "beside the dataset's id (repeatable)")
    parser.add_argument("--audit-archive", help="folder of archived audit segments (the "
                                                "Overview's chain check reads them)")
    return parser


def _named_dataset(item: str) -> tuple[str, str]:
    """``--data NAME=/abs/folder`` as (dataset id, name)."""
    name, equals, folder = item.partition("=")
    if not equals or not name or not Path(folder).is_absolute():
        raise ConfigError(f"console --data must be NAME=/abs/folder, got {item!r}")
    return dataset_id(folder), name


def main(argv: Sequence[str] | None = None) -> int:
    """Run the console; 2 with the error on stderr when the settings are refused."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        settings = ConsoleSettings(args.site, args.state, args.policy, args.host, args.port,
                                   args.tls_cert, args.tls_key, args.admin_token_file,
                                   tuple(args.origin), args.audit_archive,
                                   tuple(_named_dataset(item) for item in args.data))
    except ConfigError as exc:
        print(f"console: {exc}", file=sys.stderr)
        return 2
    serve_console(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
