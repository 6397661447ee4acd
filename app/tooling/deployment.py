"""A real deployment: TLS SuperLink with SuperNode authentication, hospital SuperNodes.

The command line behind the deployment make targets; the pieces live in
:mod:`app.tooling` (:mod:`~app.tooling.superlink`, :mod:`~app.site_runtime.supernode`,
:mod:`~app.tooling.registration`, :mod:`~app.tooling.flwr_cli`,
:mod:`~app.tooling.run_submission`, :mod:`~app.tooling.certs`). The folder
layout is :class:`~app.tooling.layout.DeployLayout`'s; the ``flwr`` CLI uses
its own ``FLWR_HOME`` (``make``: ``$(CURDIR)/.flwr-deploy``) whose
``config.toml`` holds one TLS connection, ``fedmed-deploy``.

Command line (what the make targets call)::

    python -m app.tooling.deployment superlink  --deploy-dir D --flwr-home H [--host --port]
    python -m app.tooling.deployment register   --deploy-dir D --flwr-home H --site NAME
                                                  [--public-key F]
    python -m app.tooling.deployment supernode  --deploy-dir D --site NAME --data /abs
                                                  [--state /abs] [--superlink HOST:PORT]
                                                  [--runtime-port P]
    python -m app.tooling.deployment nodes      --deploy-dir D --flwr-home H
    python -m app.tooling.deployment federate   --deploy-dir D --flwr-home H
                                                  --tracking-uri U --artifact-root A [-c k=v]
                                                  [--sign-key /abs/app-signing.key]
                                                  [--allow-no-roster] [--resume]

``federate`` checkpoints under ``D/checkpoints`` unless the preset or ``-c
checkpoint-dir=`` says where; ``--resume`` continues the newest interrupted
federation of the same run config from there.

``superlink`` and ``supernode`` run in the foreground (their log is echoed)
until Ctrl-C, then stop their daemon and everything it started.

``federate`` refuses to submit while a federation of the same name (its MLflow
experiment) is running on the SuperLink (:mod:`~app.tooling.same_name`;
``--allow-same-name``, ``make federate ALLOW_SAME_NAME=1``, submits anyway).
It exits 0 for a complete federation, 1 for a run that did not complete, 2 for
a run config it refuses, and :data:`EXIT_PARTIAL` (3) for a *partial* one: it completed,
but its final model has fewer contributing sites than run config
``federation.min-contributing-sites`` asks (a hospital revoked the app or went away).

``federate`` needs the coordinator's site roster (run config ``federation.roster``,
``make federate ROSTER=/abs/roster.toml``): without one, a registered site's first
``num-examples`` sets its weight, capped only relative to the other sites'
(``federation.max-size-ratio``). ``--allow-no-roster`` (``make federate
ALLOW_NO_ROSTER=1``) runs without one anyway; ``make simulate`` needs none.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from app.config.product_paths import PROJECT_ROOT, work_root
from app.site_runtime.app_approval import SIGNATURE_KEY, fab_sha256, project_fab, sign_app
from app.tooling.certs import CertError
from app.tooling.daemon import DaemonProcess
from app.tooling.errors import FlowerProcessError
from app.tooling.flwr_cli import CONNECTION, list_supernodes, write_connection
from app.tooling.layout import DeployLayout
from app.tooling.registration import read_registry, register_site
from app.tooling.run_config_string import build_run_config, checked_run_config
from app.tooling.run_submission import submit_run
from app.tooling.same_name import (LOST_RUN_WAIT_S, check_same_name, experiment_name,
                                   wait_for_lost_runs)
from app.tooling.state_migrations import StateFormatError
from app.tooling.superlink import DEFAULT_PORT, SuperLinkProcess
from app.site_runtime.supernode import SuperNodeProcess
from clients.site.app_rules import AppApprovalError
from clients.site.policy import SitePolicyError
from strategies.wire.errors import ConfigError

__all__ = ["EXIT_PARTIAL", "NO_ROSTER", "main"]

#: ``federate``'s exit status for a run that completed with fewer contributing sites than
#: run config ``federation.min-contributing-sites`` asks (strategies/rounds/site_coverage.py).
EXIT_PARTIAL = 3

#: Why ``federate`` refuses a run config without ``federation.roster``.
NO_ROSTER = ("a deployment needs the coordinator's site roster: pass ROSTER=/abs/roster.toml "
             "(run config 'federation.roster'; docs/DEPLOYMENT-REFERENCE.md section 3); without one a "
             "registered site's first num-examples sets its weight (capped only at "
             "'federation.max-size-ratio' x the others' median). To run without a roster "
             "anyway: make federate ALLOW_NO_ROSTER=1 (--allow-no-roster)")


# --- command line ---------------------------------------------------------------------


def _say(text: str) -> None:
    """Write ``text`` to stdout; a closed pipe (``| tee`` gone after Ctrl-C) only silences us."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):  # ValueError: a stdout already closed
        sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - for good


def supernode_hints(site: str) -> dict[str, str]:
    """Flower's SuperNode lines that do not say what to do, and what to do (issue 47,
    walkthrough 7: the reason of a refused activation is only in the coordinator's log)."""
    return {"Failed to activate SuperNode": (
        f"hint: the SuperLink refused this SuperNode's key. Is it registered? At the "
        f"coordinator: fedmed register --site {site} --public-key <this site's .pub> "
        "(make register; docs/DEPLOYMENT.md step 5); then start the SuperNode again"),
        "Connection attempt failed, retrying": (
        "note: Flower says this while the SuperLink is not answering yet; it is harmless at "
        "start, a fault if it goes on (check the SuperLink address and that it runs)")}


def _foreground(daemon: DaemonProcess, banner: str, log_file: Path,
                hints: dict[str, str] | None = None) -> int:
    """Print ``banner`` and the daemon's log as it grows until it exits or we are interrupted;
    after the first line holding a ``hints`` key, its hint (once).

    The daemon is stopped whatever happens to our output: with the output piped
    (``make superlink | tee log``), Ctrl-C ends ``tee`` too, and a write to the closed pipe
    must not skip the stop (it left the SuperLink and SuperNodes running as orphans).
    """
    _say(f"{banner}\n  log      {log_file}\nCtrl-C stops it.\n")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    position = daemon.log_offset
    pending = dict(hints or {})
    try:
        while not stop.is_set():
            try:
                with open(daemon.log_file, "rb") as handle:
                    handle.seek(position)
                    chunk = handle.read()
                    position += len(chunk)
            except OSError:
                chunk = b""
            if chunk:
                text = chunk.decode("utf-8", errors="replace")
                _say(text)
                for key in [k for k in pending if k in text]:
                    _say(f"{pending.pop(key)}\n")
            if daemon.process.poll() is not None:
                _say(f"{daemon.name} exited with code {daemon.process.returncode}\n")
                return daemon.process.returncode or 1
            stop.wait(0.5)
    finally:
        try:
            if daemon.process.poll() is None:
                _say(f"\nstopping {daemon.name} (pid {daemon.pid})...\n")
        finally:
            daemon.stop()
    return 0


def _superlink_address(args: argparse.Namespace) -> str:
    return args.superlink or f"127.0.0.1:{args.port}"


def _connected_layout(args: argparse.Namespace) -> DeployLayout:
    """The deployment folder, with the CLI's TLS connection (re)written for it."""
    layout = DeployLayout(args.deploy_dir)
    write_connection(args.flwr_home, CONNECTION, _superlink_address(args), layout.ca_cert)
    return layout


def _cmd_superlink(args: argparse.Namespace) -> int:
    link = SuperLinkProcess.start_tls(DeployLayout(args.deploy_dir), host=args.host,
                                     port=args.port)
    try:
        layout = _connected_layout(args)
    except FlowerProcessError:
        link.stop()
        raise
    cli = f"FLWR_HOME={args.flwr_home} {Path(sys.executable).parent / 'flwr'}"
    return _foreground(link, f"SuperLink on https://{link.address} (TLS, SuperNode "
                       f"authentication on), pid {link.pid}\n  database "
                       f"{layout.superlink_dir / 'state.db'}\n  CLI      {cli} supernode list "
                       f"{CONNECTION}", link.flower_log)


def _cmd_register(args: argparse.Namespace) -> int:
    layout = _connected_layout(args)
    node_id = register_site(layout, args.flwr_home, args.site, args.public_key)
    print(f"site {args.site} registered as SuperNode {node_id} (registry {layout.registry})")
    return 0


def _cmd_supernode(args: argparse.Namespace) -> int:
    layout = DeployLayout(args.deploy_dir)
    node = SuperNodeProcess.start(layout, args.site, _superlink_address(args),
                                  args.data.resolve(), args.state.resolve() if args.state
                                  else None, args.runtime_port, args.private_key,
                                  torch_threads=args.torch_threads,
                                  policy=args.policy.resolve(),
                                  state_retention_days=args.state_retention_days,
                                  console_port=args.console_port,
                                  worker_uid=args.worker_uid, proxy=args.proxy)
    via = f" via proxy {args.proxy}" if args.proxy else ""
    return _foreground(node, f"SuperNode {args.site} -> {_superlink_address(args)}{via} (pid "
                       f"{node.pid}, runtime API 127.0.0.1:{node.port})\n  data     "
                       f"{args.data.resolve()}\n  policy   {args.policy.resolve()}",
                       node.log_file, supernode_hints(args.site))


def _cmd_nodes(args: argparse.Namespace) -> int:
    layout = _connected_layout(args)
    names = {v["node-id"]: k for k, v in read_registry(layout.registry).items()}
    nodes = list_supernodes(args.flwr_home)
    print(f"{'site':<16} {'node id':<22} status")
    for node in nodes:
        print(f"{names.get(node['node-id'], '?'):<16} {node['node-id']:<22} {node['status']}")
    return 0


def _cmd_federate(args: argparse.Namespace) -> int:
    items = [*args.run_config, *(["resume=true"] if args.resume else [])]
    # A deployment checkpoints beside its folder unless the preset or -c says where.
    base = {"checkpoint-dir": str((args.deploy_dir / "checkpoints").resolve())}
    run_config = build_run_config(items, args.data_root, args.tracking_uri, args.artifact_root,
                                  args.preset, base)
    try:
        values = checked_run_config(run_config)  # before anything is signed or submitted
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not values.get("federation.roster") and not args.allow_no_roster:
        print(f"error: {NO_ROSTER}", file=sys.stderr)
        return 2
    layout = _connected_layout(args)
    if not args.allow_same_name:  # two runs of one name race for <experiment>-best
        experiment = experiment_name(values)
        found = check_same_name(args.flwr_home, args.tracking_uri, experiment)
        if found.clashes and values.get("resume"):  # after a crash: the lost run, still listed
            print(f"waiting up to {LOST_RUN_WAIT_S:.0f} s for the SuperLink to mark run(s) "
                  f"{sorted(found.clashes)} lost (their ServerApp's heartbeat running out)",
                  flush=True)
            found = wait_for_lost_runs(
                lambda: check_same_name(args.flwr_home, args.tracking_uri, experiment))
        for warning in found.warnings():
            print(f"warning: {warning}", file=sys.stderr)
        if found.refusal(experiment):
            print(f"error: {found.refusal(experiment)}", file=sys.stderr)
            return 2
    if args.sign_key is not None:  # the signature of the FAB flwr run submits
        digest = fab_sha256(project_fab(PROJECT_ROOT))
        signature = sign_app(digest, args.sign_key)
        run_config = build_run_config([*items, f"{SIGNATURE_KEY}={signature}"],
                                      args.data_root, args.tracking_uri, args.artifact_root,
                                      args.preset, base)
        print(f"app {digest[:12]} signed with {args.sign_key}", flush=True)
    started = time.monotonic()
    outcome = submit_run(args.flwr_home, run_config, args.timeout,
                         on_line=lambda line: (sys.stdout.write(line), sys.stdout.flush()))
    if outcome.run_id is None:
        print("flwr run did not start a run (see the output above)", file=sys.stderr)
        return 1
    print(f"\nrun {outcome.run_id} status: {outcome.status}")
    if outcome.status != "finished:completed":
        print(f"the run did not complete; SuperLink log: "
              f"{layout.superlink_dir / 'superlink.log'}", file=sys.stderr)
        return 1
    from app.tooling.federation_summary import print_summary  # noqa: PLC0415 - MLflow

    partial = print_summary(args.tracking_uri, outcome.run_id, time.monotonic() - started,
                            args.artifact_root)
    if partial:
        print(f"error: a partial federation (fewer sites contributed than run config "
              f"'federation.min-contributing-sites' asks; the summary's 'sites:' line): exit "
              f"{EXIT_PARTIAL}", file=sys.stderr)
        return EXIT_PARTIAL
    return 0


def _env_port() -> int:
    """``$SUPERLINK_PORT`` (as ``make`` reads it), else the default port."""
    text = os.environ.get("SUPERLINK_PORT", "").strip()
    if not text:
        return DEFAULT_PORT
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise SystemExit(f"error: SUPERLINK_PORT={text!r} is not a TCP port (1-65535)")
    return int(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, cli: bool = True) -> None:
        p.add_argument("--deploy-dir", type=Path, default=work_root() / "deploy")
        p.add_argument("--port", type=int, default=_env_port(),
                       help=f"the SuperLink's HTTPS port (default $SUPERLINK_PORT, else "
                            f"{DEFAULT_PORT})")
        p.add_argument("--superlink", default=None,
                       help="host:port the SuperLink is dialled at (a name in its "
                            "certificate); default 127.0.0.1:PORT")
        if cli:
            p.add_argument("--flwr-home", type=Path, default=work_root() / ".flwr-deploy")

    p = sub.add_parser("superlink", help="run the TLS SuperLink (foreground)")
    common(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.set_defaults(func=_cmd_superlink)

    p = sub.add_parser("register", help="register a site's public key")
    common(p)
    p.add_argument("--site", required=True)
    p.add_argument("--public-key", type=Path, default=None,
                   help="default DEPLOY/certs/sites/SITE/supernode.pub")
    p.set_defaults(func=_cmd_register)

    p = sub.add_parser("supernode", help="run a site's SuperNode (foreground)")
    common(p, cli=False)
    p.add_argument("--site", required=True)
    p.add_argument("--data", type=Path, required=True,
                   help="site data folder (manifest.csv, images.csv, labels.csv, table.csv or "
                   "vertical-site.toml)")
    p.add_argument("--state", type=Path, default=None)
    p.add_argument("--runtime-port", type=int, default=None,
                   help="the SuperNode's local runtime API port (default: a free one)")
    p.add_argument("--private-key", type=Path, default=None)
    p.add_argument("--torch-threads", type=int, default=0)
    p.add_argument("--policy", type=Path, default=PROJECT_ROOT / "configs" / "site-policy.toml",
                   help="the site policy TOML (default: configs/site-policy.toml)")
    p.add_argument("--state-retention-days", type=float, default=None,
                   help="days a federation's state folder is kept after its last change "
                        "(default 30; 0 keeps all)")
    p.add_argument("--console-port", type=int, default=None,
                   help="also serve the hospital's console on 127.0.0.1:PORT (make supernode "
                        "CONSOLE=1; off loopback: make console)")
    p.add_argument("--worker-uid", type=int, default=None,
                   help="a node started as root runs its sandboxed app workers as this uid "
                        "(default 65534; give a dedicated one)")
    p.add_argument("--proxy", default=None,
                   help="http://HOST:PORT of the hospital's HTTP(S) proxy: the SuperNode's "
                        "HTTPS to the SuperLink goes through it (CONNECT)")
    p.set_defaults(func=_cmd_supernode)

    p = sub.add_parser("nodes", help="list SuperNodes with their site names")
    common(p)
    p.set_defaults(func=_cmd_nodes)

    p = sub.add_parser("federate", help="run the app on the deployment, check its status")
    common(p)
    p.add_argument("--tracking-uri", required=True)
    p.add_argument("--artifact-root", type=Path, required=True)
    p.add_argument("--data-root", type=Path, default=work_root() / "data",
                   help="run-config data-root (simulation only; sites use node_config)")
    p.add_argument("--preset", type=Path, default=None)
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("-c", "--run-config", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--resume", action="store_true",
                   help="continue the newest interrupted federation of this run config from "
                        "its checkpoint (-c resume=true; make federate RESUME=1)")
    p.add_argument("--sign-key", type=Path, default=None,
                   help="the coordinator's app-signing key: adds -c app-signature=<signature "
                        "of the project's FAB> (app.site_runtime.app_approval)")
    p.add_argument("--allow-no-roster", action="store_true",
                   help="run without the coordinator's site roster (run config "
                        "'federation.roster'), which a deployment needs otherwise")
    p.add_argument("--allow-same-name", action="store_true",
                   help="submit even while a federation of the same name (MLflow "
                        "experiment) is running (app.tooling.same_name)")
    p.set_defaults(func=_cmd_federate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = _parser().parse_args(argv)
    for name in ("deploy_dir", "flwr_home"):
        if getattr(args, name, None) is not None:
            setattr(args, name, getattr(args, name).resolve())
    try:
        return int(args.func(args))
    except (FlowerProcessError, CertError, SitePolicyError, AppApprovalError,
            StateFormatError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
