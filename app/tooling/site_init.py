"""``fedmed site init`` and ``fedmed site start``: a hospital's site folder, made once, run often.

``init`` writes everything a hospital needs before its first federation into one folder
(a :class:`~app.tooling.layout.DeployLayout`, the layout the coordinator's ``make`` targets
use too), and never overwrites a file that exists::

    <home>/site.toml                          what `site start` reads (site, data, policy,
                                              state, SuperLink address)
    <home>/policy.toml                        the shipped site policy (configs/site-policy.toml)
                                              to review and edit; its SecAgg+ signing-key
                                              names <home>/secagg.key
    <home>/secagg.key                         the site's SecAgg+ signing key (0600)
    <home>/certs/sites/<site>/supernode.key   the SuperNode's authentication key (0600)
    <home>/certs/sites/<site>/supernode.pub   -> send to the coordinator (`fedmed register`)
    <home>/certs/ca.crt                       the coordinator's CA (--ca, or copy it here)
    <home>/supernodes/<site>/state/           the site's state (0700): ledger, audit log,
                                              console/admin-token (0600)

It prints what to send to the coordinator (the SuperNode's public key and the SecAgg+
public line) and what to run next. ``start`` runs the SuperNode from ``site.toml``
(:func:`app.tooling.deployment.main`'s ``supernode``), any option given on the command
line overriding the file's. ``--data`` is the site's data folder, or a cohort file
(``/abs/cohort.toml``, :mod:`clients.pacs.cohort`: the site's dataset is a cohort in its
PACS), checked when written (an error names the file and key) and passed on by ``start``
as the SuperNode's data: the runtime syncs it (:mod:`app.site_runtime.pacs_sync`).

Example::

    $ fedmed site init --site hospital-a --data /srv/pacs-export/ct --superlink fl.example.org:8000 \\
          --ca /tmp/ca.crt
    $ fedmed site start
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

from app.config.product_paths import PROJECT_ROOT
from app.site_runtime.console_access import ensure_admin_token
from app.site_runtime.site_proxy import check_proxy
from app.tooling.certs import CertError, check_site_name, ensure_site_keys
from app.tooling.errors import FlowerProcessError
from app.tooling.layout import DeployLayout
from clients.pacs.cohort import load_cohort
from strategies.wire.errors import ConfigError
from strategies.wire.secure_aggregation.signing import generate_key, load_key, public_text

__all__ = ["SITE_FILE", "SiteHome", "init_site", "start_argv"]

#: The file ``site start`` reads, in the site's folder.
SITE_FILE = "site.toml"
_SHIPPED_POLICY = PROJECT_ROOT / "configs" / "site-policy.toml"
_SIGNING_KEY_LINE = 'signing-key = ""'


class SiteHome:
    """The paths of a hospital's site folder."""

    def __init__(self, root: Path, site: str) -> None:
        self.root = Path(root).resolve()
        self.site = check_site_name(site)
        self.layout = DeployLayout(self.root)

    @property
    def policy(self) -> Path:
        return self.root / "policy.toml"

    @property
    def secagg_key(self) -> Path:
        return self.root / "secagg.key"

    @property
    def state(self) -> Path:
        return self.layout.supernode_dir(self.site) / "state"

    @property
    def settings(self) -> Path:
        return self.root / SITE_FILE


def _write_policy(home: SiteHome) -> bool:
    """Copy the shipped policy with this site's SecAgg+ key named; False: one exists."""
    if home.policy.exists():
        return False
    text = _SHIPPED_POLICY.read_text()
    if text.count(_SIGNING_KEY_LINE) != 1:
        raise ConfigError(f"{_SHIPPED_POLICY}: expected one line `{_SIGNING_KEY_LINE}` in "
                          "[secure-aggregation]")
    text = text.replace(_SIGNING_KEY_LINE, f"signing-key = {json.dumps(str(home.secagg_key))}")
    home.policy.write_text(text)
    return True


def init_site(root: Path, site: str, data: Path, superlink: str, ca: Path | None = None,
              out=sys.stdout, proxy: str | None = None) -> SiteHome:
    """Make (or complete) the site folder ``root``; returns its paths.

    Raises
    ------
    ConfigError
        A bad site name, a missing data folder or CA file, a cohort file that does not
        load (:class:`~clients.pacs.errors.CohortError`, naming the file and key), or a
        ``site.toml`` that names another site; the message names the file or option.
    """
    home = SiteHome(root, site)
    if proxy is not None:
        try:
            check_proxy(proxy)
        except FlowerProcessError as exc:
            raise ConfigError(f"--proxy: {exc}") from None
    data = Path(data).resolve()
    if data.is_file():
        load_cohort(data)  # a cohort in the site's PACS: checked now, naming the file and key
    elif not data.is_dir():
        raise ConfigError(f"--data {data}: no such folder or cohort file (the site's data "
                          "folder, or its PACS cohort file)")
    if home.settings.exists():
        existing = read_settings(home.root)
        if existing.get("site") != home.site:
            raise ConfigError(f"{home.settings}: is the folder of site {existing.get('site')!r}, "
                              f"not {home.site!r}; choose another --home")
    home.root.mkdir(parents=True, exist_ok=True)
    made: list[str] = []
    if ensure_site_keys(home.layout.certs, home.site):
        made.append(f"SuperNode key {home.layout.public_key(home.site)}")
    if home.secagg_key.exists():
        key = load_key(home.secagg_key)
    else:
        key = generate_key(home.secagg_key)
        made.append(f"SecAgg+ signing key {home.secagg_key}")
    if _write_policy(home):
        made.append(f"site policy {home.policy}")
    home.state.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(home.state, 0o700)
    token, new_token = ensure_admin_token(home.state)
    if new_token:
        made.append(f"console admin token {token}")
    if ca is not None:
        ca = Path(ca).resolve()
        if not ca.is_file():
            raise ConfigError(f"--ca {ca}: no such file (the coordinator's ca.crt)")
        if ca != home.layout.ca_cert.resolve():
            shutil.copyfile(ca, home.layout.ca_cert)
            made.append(f"the coordinator's CA {home.layout.ca_cert}")
    if not home.settings.exists():
        home.settings.write_text(
            "# `fedmed site start` reads this file; an option on its command line wins.\n"
            f"site = {json.dumps(home.site)}\ndata = {json.dumps(str(data))}\n"
            f"superlink = {json.dumps(superlink)}\npolicy = {json.dumps(str(home.policy))}\n"
            f"state = {json.dumps(str(home.state))}\n"
            + (f"proxy = {json.dumps(proxy)}\n" if proxy else ""))
        made.append(f"site settings {home.settings}")
    print(f"site {home.site}: folder {home.root}", file=out)
    for line in made or ["nothing new: every file existed and was kept"]:
        print(f"  made {line}" if made else f"  {line}", file=out)
    print("send to the coordinator:\n"
          f"  the SuperNode key  {home.layout.public_key(home.site)}  (fedmed register)\n"
          f"  the SecAgg+ line   {home.site} {public_text(key)}  (fedmed secagg roster-add)",
          file=out)
    if not home.layout.ca_cert.is_file():
        print(f"copy the coordinator's ca.crt to {home.layout.ca_cert}", file=out)
    print(f"review {home.policy} (docs/DEPLOYMENT.md), then: fedmed site start --home "
          f"{home.root}", file=out)
    return home


def read_settings(root: Path) -> dict:
    """``<root>/site.toml``; raises :class:`ConfigError` naming the file."""
    path = Path(root) / SITE_FILE
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no site folder here; run `fedmed site init --home "
                          f"{root} --site NAME --data /abs/folder --superlink HOST:PORT` "
                          "first") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read ({exc})") from exc


def start_argv(root: Path, extra: Sequence[str]) -> list[str]:
    """The ``deployment supernode`` arguments of the site folder ``root`` plus ``extra``."""
    settings = read_settings(root)
    given = {arg.split("=", 1)[0] for arg in extra if arg.startswith("--")}
    argv = ["supernode", "--deploy-dir", str(Path(root).resolve())]
    for key in ("site", "data", "superlink", "policy", "state", "proxy"):
        if f"--{key}" not in given and settings.get(key):
            argv += [f"--{key}", str(settings[key])]
    return [*argv, *extra]


def init_main(argv: Sequence[str] | None = None) -> int:
    """``fedmed site init``: make the site folder; exit code 2 on a bad option."""
    parser = argparse.ArgumentParser(prog="fedmed site init",
                                     description="make a hospital's site folder (never "
                                                 "overwrites a file)")
    parser.add_argument("--home", type=Path, default=Path("fedmed-site"),
                        help="the site folder (default ./fedmed-site)")
    parser.add_argument("--site", required=True, help="the site's name, as the coordinator "
                                                      "registers it")
    parser.add_argument("--data", type=Path, required=True,
                        help="the site's data folder, or its PACS cohort file (/abs/cohort.toml)")
    parser.add_argument("--superlink", required=True, help="HOST:PORT of the SuperLink")
    parser.add_argument("--ca", type=Path, default=None, help="the coordinator's ca.crt")
    parser.add_argument("--proxy", default=None, help="http://HOST:PORT of the hospital's "
                        "HTTP(S) proxy to the SuperLink (site.toml key proxy)")
    args = parser.parse_args(argv)
    try:
        init_site(args.home, args.site, args.data, args.superlink, args.ca, proxy=args.proxy)
    except (ConfigError, CertError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
