"""Who may reach the hospital's console and act through it: settings, bind rule, login, CSRF.

The console (:mod:`app.site_runtime.console`) shows what left the site and lets the
hospital approve or revoke app bundles, so it guards itself as follows:

* **Bind rule.** It listens on loopback (``127.0.0.1``, ``::1``, ``localhost``) by
  default. Any other address requires TLS (``--tls-cert``, ``--tls-key``);
  :class:`ConsoleSettings` refuses to start without it, with a
  :class:`~strategies.wire.errors.ConfigError` naming the missing option. A wildcard
  address (``0.0.0.0``, ``::``) also needs ``--origin``, the address browsers use, for
  the origin check below.
* **Admin token, always.** Every page but the login form (and its stylesheet), every
  POST included, needs a session that logged in with the admin token (compared with
  :func:`hmac.compare_digest`), on loopback too: the CSRF check stops browsers, not
  another program on the host. The token is ``--admin-token-file`` when given, else
  ``<state-dir>/console/admin-token`` (:func:`admin_token_path`): drawn with
  :func:`secrets.token_urlsafe` at the console's first start, the node's own console
  (``make supernode CONSOLE=1``) included, and written atomically with mode 0600 in a
  folder of mode 0700 that the site's sandboxed worker never sees
  (:func:`ensure_admin_token`); later starts reuse it. A token file that group or
  others may read or write is refused, naming the file.
* **Sessions.** An ``HttpOnly``, ``SameSite=Strict`` cookie (``Secure`` under TLS)
  holding ``<id>.<issued>.<admin flag>.<HMAC-SHA256>``, signed with a key drawn when
  the console starts (a restart logs everyone out); valid :data:`SESSION_SECONDS`.
* **CSRF.** Every POST must carry the session's CSRF token (an HMAC of the session
  id) in the hidden form field ``csrf`` and an ``Origin`` (or, without one, a
  ``Referer``) of the console's own origin; the ``Host`` header must name the console
  too (DNS rebinding). Else 403 and nothing changes.
* **Headers.** ``Content-Security-Policy: default-src 'self'`` (no script at all),
  ``X-Frame-Options: DENY``, ``Referrer-Policy: same-origin``. (``no-referrer`` would
  make Chromium send ``Origin: null`` with the console's own form posts, per the Fetch
  standard, and the origin check could not tell them from a forged one; ``same-origin``
  sends nothing to any other site either.)
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from strategies.wire.errors import ConfigError

__all__ = ["CONSOLE_DIR", "CSRF_FIELD", "ConsoleSettings", "SESSION_COOKIE", "SESSION_SECONDS",
           "Session", "SessionSigner", "TOKEN_NAME", "admin_token_path", "ensure_admin_token",
           "is_loopback", "origin_of", "read_admin_token", "request_origin_ok", "token_ok"]

#: The console's runtime-private folder in the state dir (hidden from the sandboxed worker).
CONSOLE_DIR = "console"
#: The admin token's file in :data:`CONSOLE_DIR`, made at the console's first start.
TOKEN_NAME = "admin-token"

#: The session cookie's name, before ``_<port>`` (browsers share cookies across the ports
#: of one host: two sites' consoles on one machine would log each other out).
SESSION_COOKIE = "fedmed_console"
#: The hidden form field that carries the CSRF token.
CSRF_FIELD = "csrf"
#: How long a session stays valid (seconds).
SESSION_SECONDS = 12 * 3600
#: The shortest admin token accepted (characters).
MIN_TOKEN_CHARS = 16
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_WILDCARDS = ("0.0.0.0", "::", "")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an IP address, brackets allowed) is this machine only."""
    host = host.strip("[]")
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of ``url``, lower-cased ("" when it has none)."""
    parts = urlsplit(url.strip())
    if not parts.scheme or not parts.netloc:
        return ""
    return f"{parts.scheme}://{parts.netloc}".lower()


def admin_token_path(state_dir: Path) -> Path:
    """The admin token file of a console given none: ``<state>/console/admin-token``."""
    return Path(state_dir) / CONSOLE_DIR / TOKEN_NAME


def ensure_admin_token(state_dir: Path) -> tuple[Path, bool]:
    """``(the state dir's admin token file, whether it was made now)``.

    An existing file is kept as it is. Else a token from :func:`secrets.token_urlsafe`
    goes to a temporary file of mode 0600 in :data:`CONSOLE_DIR` (made with mode
    0700), is fsynced and hard-linked to :data:`TOKEN_NAME`: the name appears whole or
    not at all, and a token another console made meanwhile is never replaced.

    Raises
    ------
    ConfigError
        The folder or file cannot be written; the message names it.
    """
    path = admin_token_path(state_dir)
    if os.path.lexists(path):
        return path, False
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{TOKEN_NAME}.", suffix=".tmp")
    except OSError as exc:
        raise ConfigError(f"console admin token {path}: cannot be made ({exc})") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(secrets.token_urlsafe(32) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.link(tmp, path)
    except FileExistsError:
        return path, False
    except OSError as exc:
        raise ConfigError(f"console admin token {path}: cannot be made ({exc})") from exc
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path, True


def read_admin_token(path: Path, source: str = "--admin-token-file") -> str:
    """The admin token in ``path`` (surrounding whitespace dropped).

    Parameters
    ----------
    path : Path
        The token file.
    source : str
        How the file was chosen, for the messages (the option, or "admin token").

    Raises
    ------
    ConfigError
        The file is unreadable, group or others have any access to it (mode & 0o077),
        or it holds fewer than :data:`MIN_TOKEN_CHARS` characters; the message names
        ``source`` and the file.
    """
    try:
        mode = stat.S_IMODE(Path(path).stat().st_mode)
        if mode & 0o077:
            raise ConfigError(f"console {source} {path}: mode {mode:04o} gives group or "
                              f"others access to the admin token; make it the owner's alone "
                              f"(chmod 600 {path})")
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"console {source} {path}: unreadable ({exc})") from exc
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"console {source} {path}: the token must have at least "
                          f"{MIN_TOKEN_CHARS} characters, it has {len(token)}")
    return token


def _existing(path: str | Path | None, option: str, folder: bool = False) -> Path | None:
    if path is None or str(path) == "":
        return None
    resolved = Path(path).expanduser().resolve()
    if not (resolved.is_dir() if folder else resolved.is_file()):
        raise ConfigError(f"console {option} {resolved}: no such {'folder' if folder else 'file'}")
    return resolved


@dataclass(frozen=True)
class ConsoleSettings:
    """What the console serves and how; every check runs when it is built.

    Parameters
    ----------
    site : str
        The site's name (shown in the header).
    state_dir : Path
        The SuperNode's state dir (audit log, privacy ledgers, data reports).
    policy_path : Path
        The site policy file the console shows and edits (approve / revoke).
    host, port : str, int
        The address it listens on (default ``127.0.0.1:8470``).
    tls_cert, tls_key : Path, optional
        PEM certificate and key: required together, and for any non-loopback host.
    admin_token_file : Path, optional
        A file holding the admin token (``make console ADMIN_TOKEN_FILE=``); by
        default the state dir's own, made at the first start (:func:`ensure_admin_token`).
    origins : tuple of str
        Further origins (``https://name:port``) browsers reach the console by;
        required for a wildcard host.
    audit_archive : Path, optional
        The folder the hospital moves rotated audit segments to (``make audit-verify
        ARCHIVE=``): the Overview's chain check reads them as if in place.
    datasets : tuple of (str, str)
        (dataset id, the name the site gave it): the pages show the name with the id
        beside it (node_config ``dataset-name``, default the data folder's name).

    Attributes
    ----------
    admin_token : str
        The token a login must give (never in ``repr``).
    admin_token_made : bool
        Whether this start made ``admin_token_file`` (the state dir's first start).

    Raises
    ------
    ConfigError
        A missing folder or file, a missing option the bind rule requires, a bad port,
        a token file others may read; the message names the option or file.
    """

    site: str
    state_dir: Path
    policy_path: Path
    host: str = "127.0.0.1"
    port: int = 8470
    tls_cert: Path | None = None
    tls_key: Path | None = None
    admin_token_file: Path | None = None
    origins: tuple[str, ...] = ()
    audit_archive: Path | None = None
    datasets: tuple[tuple[str, str], ...] = ()
    admin_token: str = field(default="", init=False, repr=False, compare=False)
    admin_token_made: bool = field(default=False, init=False, compare=False)

    def __post_init__(self) -> None:
        if not self.site:
            raise ConfigError("console --site: the site's name is required")
        if self.state_dir is None or str(self.state_dir) == "":
            raise ConfigError("console --state: the site's state dir is required")
        if self.policy_path is None or str(self.policy_path) == "":
            raise ConfigError("console --policy: the site policy file is required")
        object.__setattr__(self, "state_dir", _existing(self.state_dir, "--state", folder=True))
        object.__setattr__(self, "policy_path", _existing(self.policy_path, "--policy"))
        object.__setattr__(self, "audit_archive",
                           _existing(self.audit_archive, "--audit-archive", folder=True))
        if isinstance(self.port, bool) or not isinstance(self.port, int) \
                or not 1 <= self.port <= 65535:
            raise ConfigError(f"console --port must be a port number 1..65535, got {self.port!r}")
        for name in ("tls_cert", "tls_key", "admin_token_file"):
            option = "--" + name.replace("_", "-")
            object.__setattr__(self, name, _existing(getattr(self, name), option))
        if (self.tls_cert is None) != (self.tls_key is None):
            missing = "--tls-key" if self.tls_key is None else "--tls-cert"
            raise ConfigError(f"console {missing} is required with "
                              f"{'--tls-cert' if missing == '--tls-key' else '--tls-key'}")
        if not is_loopback(self.host):
            for option, value in (("--tls-cert", self.tls_cert), ("--tls-key", self.tls_key)):
                if value is None:
                    raise ConfigError(f"console --host {self.host} is not loopback: "
                                      f"{option} is required (TLS)")
        origins = tuple(origin_of(o) for o in self.origins)
        if "" in origins:
            raise ConfigError(f"console --origin must be scheme://host[:port], got "
                              f"{list(self.origins)}")
        if self.host in _WILDCARDS and not origins:
            raise ConfigError(f"console --host {self.host or '(any)'} listens on every address: "
                              "--origin https://<name>:<port> (the address browsers use) is "
                              "required for the origin check")
        object.__setattr__(self, "origins", origins)
        source = "--admin-token-file"
        if self.admin_token_file is None:
            source = "admin token"
            path, made = ensure_admin_token(self.state_dir)
            object.__setattr__(self, "admin_token_file", path)
            object.__setattr__(self, "admin_token_made", made)
        object.__setattr__(self, "admin_token", read_admin_token(self.admin_token_file, source))

    @property
    def admin_token_note(self) -> str:
        """Where the admin token comes from, for the console's log (never the token itself)."""
        if self.admin_token_file != admin_token_path(self.state_dir):
            return "given with --admin-token-file"
        return "made now, mode 0600" if self.admin_token_made else "kept from an earlier start"

    @property
    def cookie_name(self) -> str:
        """This console's session cookie: :data:`SESSION_COOKIE` and its port."""
        return f"{SESSION_COOKIE}_{self.port}"

    @property
    def tls(self) -> bool:
        """Whether the console serves HTTPS."""
        return self.tls_cert is not None

    def own_origins(self) -> frozenset[str]:
        """Every origin the console answers as (its address, loopback names, ``--origin``)."""
        scheme = "https" if self.tls else "http"
        hosts = [] if self.host in _WILDCARDS else [self.host]
        if is_loopback(self.host):
            hosts += _LOOPBACK_NAMES
        default_port = 443 if self.tls else 80
        found = set(self.origins)
        for host in hosts:
            name = f"[{host.strip('[]')}]" if ":" in host else host
            found.add(f"{scheme}://{name}:{self.port}".lower())
            if self.port == default_port:
                found.add(f"{scheme}://{name}".lower())
        return frozenset(found)

    def own_hosts(self) -> frozenset[str]:
        """The ``Host`` header values of :meth:`own_origins` (``host[:port]``)."""
        return frozenset(urlsplit(origin).netloc for origin in self.own_origins())


@dataclass(frozen=True)
class Session:
    """A browser's session: its id, when it was issued, whether it logged in as admin."""

    sid: str
    issued: int
    admin: bool


class SessionSigner:
    """Signs and checks session cookies and derives each session's CSRF token.

    Parameters
    ----------
    key : bytes, optional
        The HMAC key; a fresh random one by default (sessions end with the process).
    """

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or secrets.token_bytes(32)

    def _mac(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()

    def new(self, admin: bool) -> Session:
        """A fresh session (a new id: a login never keeps the id it came with)."""
        return Session(secrets.token_hex(16), int(time.time()), admin)

    def dump(self, session: Session) -> str:
        """The cookie value of ``session``."""
        body = f"{session.sid}.{session.issued}.{int(session.admin)}"
        return f"{body}.{self._mac(body)}"

    def load(self, cookie: str | None, now: float | None = None) -> Session | None:
        """The session a cookie holds, or None when it is absent, forged or expired."""
        parts = (cookie or "").split(".")
        if len(parts) != 4 or not parts[1].isdigit() or parts[2] not in ("0", "1"):
            return None
        body = ".".join(parts[:3])
        if not hmac.compare_digest(self._mac(body), parts[3]):
            return None
        issued = int(parts[1])
        if (time.time() if now is None else now) - issued > SESSION_SECONDS:
            return None
        return Session(parts[0], issued, parts[2] == "1")

    def csrf_token(self, session: Session) -> str:
        """The CSRF token of ``session`` (the hidden ``csrf`` field of its forms)."""
        return self._mac(f"csrf:{session.sid}")

    def sign_text(self, text: str) -> str:
        """A MAC of ``text`` (a result message carried in a redirect's query)."""
        return self._mac(f"text:{text}")

    def text_ok(self, text: str, mac: str) -> bool:
        """Whether ``mac`` is :meth:`sign_text` of ``text``: a forged link shows nothing."""
        return hmac.compare_digest(self.sign_text(text), mac)

    def csrf_ok(self, session: Session, token: str) -> bool:
        """Whether ``token`` is the CSRF token of ``session`` (constant-time)."""
        return hmac.compare_digest(self.csrf_token(session), token)


def token_ok(settings: ConsoleSettings, given: str) -> bool:
    """Whether ``given`` is the admin token (constant-time); never for an empty token."""
    return bool(settings.admin_token) and hmac.compare_digest(
        settings.admin_token.encode(), given.strip().encode())


def request_origin_ok(settings: ConsoleSettings, origin: str | None, referer: str | None) -> bool:
    """Whether a POST comes from the console's own pages.

    ``Origin`` decides when the browser sent one; else ``Referer``; a request with
    neither (or ``Origin: null``) is refused.
    """
    claimed = origin_of(origin) if origin else origin_of(referer or "")
    return claimed in settings.own_origins()
