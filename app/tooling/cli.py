"""``fedmed``: the one command of a hospital and of the coordinator (the wheel's console script).

Each subcommand is the entry point a make target calls (``make supernode`` is
``fedmed site start``'s :func:`app.tooling.deployment.main`, ``make audit-verify`` is
``fedmed audit verify``'s :func:`app.site_runtime.audit_chain.main`, ...): the options
after the subcommand are that entry point's own (``fedmed <subcommand> --help``).

At a hospital::

    fedmed site init --site NAME --data /abs/folder --superlink HOST:PORT [--ca ca.crt]
    fedmed site start [--home fedmed-site] [supernode options, e.g. --console-port 8470]
    fedmed console --site NAME --state STATE --policy POLICY
    fedmed audit verify --state STATE --policy POLICY
    fedmed privacy budget --state STATE
    fedmed predict --model URI --data /abs/folder --out /abs/out [--store-to /abs/cohort.toml --policy POLICY --state /abs/state]
    fedmed app approve --policy POLICY --sha256 DIGEST [--state STATE]
    fedmed app revoke  --policy POLICY --sha256 DIGEST --state STATE [--reason TEXT]
    fedmed secagg key --site NAME --out /abs/secagg.key
    fedmed psi-secret --out /abs/psi.secret

At the coordinator::

    fedmed certs --out deploy/certs --hosts fl.example.org --sites hospital-a,hospital-b
    fedmed superlink | register --site NAME --public-key F | nodes
    fedmed federate [--resume] [-c key=value ...]   (./mlflow.db, ./mlartifacts, ./deploy/checkpoints)
    fedmed app keygen --out DIR | app sign --key KEY [--expires YYYY-MM-DD]
    fedmed secagg roster-add ... | roster-list ...
    fedmed simulate --data-root /abs/hospitals   |   fedmed data synthetic --task pe-seg --out DIR
    fedmed tracking-flush RUN_DIR

Subcommands are imported only when run (``fedmed --help`` loads no torch).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from app.config.product_paths import work_root

__all__ = ["COMMANDS", "main"]

#: ``words -> (entry point "module:function", arguments put first)``.
COMMANDS: dict[tuple[str, ...], tuple[str, tuple[str, ...]]] = {
    ("site", "init"): ("app.tooling.site_init:init_main", ()),
    ("site", "start"): ("app.tooling.cli:_site_start", ()),
    ("console",): ("app.site_runtime.console:main", ()),
    ("audit", "verify"): ("app.site_runtime.audit_chain:main", ()),
    ("privacy", "budget"): ("app.site_runtime.privacy_budget:main", ()),
    ("predict",): ("app.predict:main", ()),
    ("app", "keygen"): ("app.site_runtime.app_approval:main", ("keygen",)),
    ("app", "hash"): ("app.site_runtime.app_approval:main", ("hash",)),
    ("app", "sign"): ("app.site_runtime.app_approval:main", ("sign",)),
    ("app", "approve"): ("app.site_runtime.app_approval:main", ("approve",)),
    ("app", "revoke"): ("app.tooling.cli:_app_revoke", ()),
    ("certs",): ("app.tooling.certs:main", ()),
    ("superlink",): ("app.tooling.deployment:main", ("superlink",)),
    ("register",): ("app.tooling.deployment:main", ("register",)),
    ("nodes",): ("app.tooling.deployment:main", ("nodes",)),
    ("federate",): ("app.tooling.cli:_federate", ()),
    ("simulate",): ("app.tooling.cli:_simulate", ()),
    ("data",): ("clients.datagen.__main__:main", ()),
    ("secagg", "key"): ("app.tooling.secagg_keys:main", ("keygen",)),
    ("secagg", "roster-add"): ("app.tooling.secagg_keys:main", ("add",)),
    ("secagg", "roster-list"): ("app.tooling.secagg_keys:main", ("list",)),
    ("psi-secret",): ("app.tooling.psi_secret:main", ()),
    ("tracking-flush",): ("app.tracking.flush:main", ()),
}


def _entry(spec: str) -> Callable[[list[str]], int]:
    """The function ``module:function`` names (the wheel's build moves it under ``fedmed.``)."""
    module, function = spec.split(":")
    return getattr(importlib.import_module(module), function)


def _take(argv: list[str], option: str, default: str) -> tuple[str, list[str]]:
    """``(value of --option, argv without it)``; both ``--option V`` and ``--option=V``."""
    rest, value, i = [], default, 0
    while i < len(argv):
        if argv[i] == option and i + 1 < len(argv):
            value, i = argv[i + 1], i + 2
        elif argv[i].startswith(option + "="):
            value, i = argv[i].split("=", 1)[1], i + 1
        else:
            rest.append(argv[i])
            i += 1
    return value, rest


def _given(argv: list[str], option: str) -> bool:
    return any(a == option or a.startswith(option + "=") for a in argv)


def _tracking_defaults(argv: list[str]) -> list[str]:
    """The working folder's MLflow store and artifact root, unless given."""
    extra = []
    if not _given(argv, "--tracking-uri"):
        extra += ["--tracking-uri", f"sqlite:///{work_root() / 'mlflow.db'}"]
    if not _given(argv, "--artifact-root"):
        extra += ["--artifact-root", str(work_root() / "mlartifacts")]
    return extra


def _site_start(argv: list[str]) -> int:
    """``fedmed site start [--home DIR] [supernode options]``."""
    from app.tooling.site_init import start_argv  # noqa: PLC0415 - imported when run
    from strategies.wire.errors import ConfigError  # noqa: PLC0415

    home, rest = _take(list(argv), "--home", "fedmed-site")
    try:
        command = start_argv(Path(home), rest)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _entry("app.tooling.deployment:main")(command)


def _federate(argv: list[str]) -> int:
    """``fedmed federate [--resume] [deployment federate options]``: the server checkpoints
    under ``<deploy-dir>/checkpoints`` unless the preset or ``-c checkpoint-dir=...`` says
    where; ``--resume`` (``make federate RESUME=1``) continues the newest interrupted
    federation from them (:func:`app.tooling.deployment.main`)."""
    args = list(argv)
    return _entry("app.tooling.deployment:main")(["federate", *_tracking_defaults(args), *args])


def _simulate(argv: list[str]) -> int:
    return _entry("app.tooling.simulate:main")([*_tracking_defaults(argv), *argv])


def _app_revoke(argv: list[str]) -> int:
    """``fedmed app revoke``: the console's revoke (policy edited atomically, audited)."""
    from app.site_runtime.policy_edit import apply_edit  # noqa: PLC0415
    from strategies.wire.errors import FedMedError  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="fedmed app revoke",
                                     description="revoke an app bundle at this site")
    parser.add_argument("--policy", type=Path, required=True)
    parser.add_argument("--state", type=Path, required=True,
                        help="the site's state dir (the revocation goes to its audit log)")
    parser.add_argument("--sha256", required=True, help="the bundle's digest (64 hex)")
    parser.add_argument("--reason", default="")
    args = parser.parse_args(argv)
    try:
        edit = apply_edit(args.policy.resolve(), args.state.resolve(), "revoke",
                          args.sha256.strip().lower(), args.reason, by="cli")
    except FedMedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for change in edit.changes or ["nothing to change: the app is revoked already"]:
        print(change)
    return 0


def _usage() -> str:
    lines = [__doc__.split("\n\n")[0], "", "commands:"]
    lines += [f"  fedmed {' '.join(words)}" for words in COMMANDS]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``fedmed``; returns the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if args else 2
    for size in (2, 1):
        words = tuple(args[:size])
        if words in COMMANDS:
            spec, prefix = COMMANDS[words]
            return int(_entry(spec)([*prefix, *args[size:]]) or 0)
    near = sorted(" ".join(w) for w in COMMANDS if w[0] == args[0])
    hint = f"; did you mean: {', '.join('fedmed ' + n for n in near)}" if near else ""
    print(f"fedmed: unknown command {' '.join(args[:2])!r}{hint} (fedmed --help)",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
