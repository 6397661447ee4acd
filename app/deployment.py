"""A real deployment: TLS SuperLink with SuperNode authentication, hospital SuperNodes.

Builds on :mod:`app.flower_processes` (environment, free ports, process-group
stops, run status) and :mod:`app.certs` (CA, SuperLink certificate, site keys).
Every daemon is started in its own process group and stopped by PID with
bounded waits; the helper daemons Flower starts in their own sessions
(``flower-superexec``, ClientApp / ServerApp processes) are tracked as
descendants and stopped by PID too.

Layout under the deployment folder (``make``: ``$(CURDIR)/deploy``)::

    certs/ca.crt, ca.key, superlink.crt, superlink.key     (app.certs)
    certs/sites/<site>/supernode.key, supernode.pub          (app.certs)
    superlink/state.db, superlink.log, superlink.stdout, sites.json, flwr-home/
    supernodes/<site>/supernode.log, state/, flwr-home/

The ``flwr`` CLI uses its own ``FLWR_HOME`` (``make``: ``$(CURDIR)/.flwr-deploy``)
whose ``config.toml`` holds one TLS connection, ``fedmed-deploy``.

Command line (what the make targets call)::

    python -m app.deployment superlink  --deploy-dir D --flwr-home H [--host --port]
    python -m app.deployment register   --deploy-dir D --flwr-home H --site NAME [--public-key F]
    python -m app.deployment supernode  --deploy-dir D --site NAME --data /abs [--state /abs]
                                        [--superlink HOST:PORT] [--runtime-port P]
    python -m app.deployment nodes      --deploy-dir D --flwr-home H
    python -m app.deployment federate   --deploy-dir D --flwr-home H --tracking-uri U --artifact-root A [-c k=v]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.certs import CertError, cert_paths, check_site_name, site_key_paths
from app.flower_processes import (
    FlowerProcessError,
    flower_env,
    free_port,
    run_status,
    stop_process_group,
)

__all__ = [
    "CONNECTION",
    "DeployLayout",
    "DaemonProcess",
    "TLSSuperLink",
    "SuperNodeProcess",
    "RunOutcome",
    "write_tls_connection",
    "register_site",
    "list_supernodes",
    "wait_online",
    "submit_run",
    "node_config_string",
    "start_time",
    "descendants",
]

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CONNECTION = "fedmed-deploy"
DEFAULT_PORT = 8000
_RUN_ID = re.compile(r"Successfully started run (\d+)")
_KEY_IN_USE = "Public key already in use"
_NODE_ID_LINE = "SuperNode ID:"


# --- layout ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DeployLayout:
    """Paths of one deployment folder (the same layout at every site)."""

    root: Path

    @property
    def certs(self) -> Path:
        """Folder of ``app.certs`` (CA, SuperLink certificate, site keys)."""
        return self.root / "certs"

    @property
    def ca_cert(self) -> Path:
        """The CA certificate every SuperNode and the CLI verify the SuperLink with."""
        return cert_paths(self.certs).ca_cert

    @property
    def superlink_dir(self) -> Path:
        """The SuperLink's database, logs and site registry."""
        return self.root / "superlink"

    @property
    def registry(self) -> Path:
        """``sites.json``: site name -> registered node id (Flower stores no names)."""
        return self.superlink_dir / "sites.json"

    def supernode_dir(self, site: str) -> Path:
        """A site's SuperNode log, default state folder and ``FLWR_HOME``."""
        return self.root / "supernodes" / check_site_name(site)

    def private_key(self, site: str) -> Path:
        """The site's SuperNode authentication private key (OpenSSH format)."""
        return site_key_paths(self.certs, site).private_key

    def public_key(self, site: str) -> Path:
        """The site's SuperNode authentication public key (OpenSSH line)."""
        return site_key_paths(self.certs, site).public_key


def write_tls_connection(flwr_home: Path, name: str, address: str,
                         root_certificates: Path) -> None:
    """Write ``FLWR_HOME/config.toml`` with one TLS SuperLink connection, the default.

    ``root_certificates`` must be absolute (Flower rejects relative paths); the
    address must be a name the SuperLink's certificate lists as SubjectAltName.
    """
    root_certificates = Path(root_certificates).resolve()
    if not root_certificates.is_file():
        raise FlowerProcessError(f"CA certificate {root_certificates} is missing; "
                                 "run `make certs` (coordinator) or copy ca.crt here")
    flwr_home.mkdir(parents=True, exist_ok=True)
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "{name}"\n\n'
        f'[superlink.{name}]\naddress = "{address}"\n'
        f'root-certificates = "{root_certificates}"\n',
        encoding="utf-8")


def node_config_string(data_path: Path, state_dir: Path, site: str) -> str:
    """``--node-config`` value for a hospital SuperNode (absolute paths, quoted)."""
    for label, path in (("data", data_path), ("state", state_dir)):
        if not Path(path).is_absolute():
            raise FlowerProcessError(f"{label} path must be absolute, got {str(path)!r}")
        if '"' in str(path) or "\\" in str(path):
            raise FlowerProcessError(f"{label} path must not contain quotes or "
                                     f"backslashes: {str(path)!r}")
    return (f'data-path="{data_path}" state-dir="{state_dir}" '
            f'site-name="{check_site_name(site)}"')


# --- processes ------------------------------------------------------------------------


def start_time(pid: int) -> str | None:
    """Start time of ``pid`` (field 22 of /proc/pid/stat), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, start time) of every live descendant of ``pid`` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        started = start_time(child)
        if started is not None:
            found.append((child, started))
        todo.extend(children.get(child, []))
    return found


def _stop_pids(pids: Iterable[tuple[int, str]], timeout: float) -> None:
    """Wait for these processes to exit, then SIGTERM / SIGKILL the ones left.

    A PID is only signalled while its start time is unchanged (no PID reuse).
    """
    alive = list(pids)
    for sig, wait in ((None, timeout), (signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        alive = [(p, s) for p, s in alive if start_time(p) == s]
        for pid, _ in alive:
            if sig is not None:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + wait
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = [(p, s) for p, s in alive if start_time(p) == s]
        if not alive:
            return


def _poll(check: Callable[[], bool], timeout: float, watch: Sequence[DaemonProcess] = (),
          interval: float = 1.0) -> bool:
    """Call ``check`` until it returns True (-> True) or ``timeout`` passes (-> False).

    Raises :class:`FlowerProcessError` as soon as a daemon in ``watch`` exits.
    """
    deadline = time.monotonic() + timeout
    while True:
        for daemon in watch:
            if daemon.process.poll() is not None:
                raise FlowerProcessError(f"{daemon.name} exited with code "
                                         f"{daemon.process.returncode}; see {daemon.log_file}")
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


@dataclass
class DaemonProcess:
    """A Flower daemon we started in its own process group, with its log."""

    process: subprocess.Popen
    log_file: Path
    name: str
    log_offset: int = 0

    @property
    def pid(self) -> int:
        """Process id (also its process group id)."""
        return self.process.pid

    def stop(self, timeout: float = 15.0) -> None:
        """Stop it by PID (SIGTERM, then SIGKILL) and every process it started."""
        helpers = descendants(self.process.pid)
        stop_process_group(self.process, timeout=timeout)
        _stop_pids(helpers, timeout=5.0)

    def log_text(self) -> str:
        """What it logged since it started (its log file is appended to)."""
        try:
            with open(self.log_file, "rb") as handle:
                handle.seek(self.log_offset)
                return handle.read().decode("utf-8", errors="replace")
        except OSError:
            return ""


def _spawn(command: list[str], env: dict[str, str], log_file: Path, name: str,
           cwd: Path) -> DaemonProcess:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        offset = out.tell()
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   cwd=cwd, start_new_session=True)
    return DaemonProcess(process=process, log_file=log_file, name=name, log_offset=offset)


@dataclass
class TLSSuperLink(DaemonProcess):
    """``flower-superlink`` with TLS, SuperNode authentication and a database."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    ca_cert: Path = Path()
    flower_log: Path = Path()

    @property
    def address(self) -> str:
        """``host:port`` of its one HTTPS port (Fleet, Control and runtime APIs)."""
        return f"{self.host}:{self.port}"

    @classmethod
    def start(cls, layout: DeployLayout, host: str = "127.0.0.1", port: int | None = None,
              startup_timeout: float = 60.0) -> TLSSuperLink:
        """Start the SuperLink on ``host:port`` (a free port if None) and wait for it."""
        certs = cert_paths(layout.certs)
        missing = [p for p in (certs.ca_cert, certs.server_cert, certs.server_key)
                   if not p.is_file()]
        if missing:
            raise FlowerProcessError(f"missing {', '.join(map(str, missing))}; run `make certs`")
        port = port or free_port()
        folder = layout.superlink_dir
        folder.mkdir(parents=True, exist_ok=True)
        flower_log = folder / "superlink.log"
        command = [
            "flower-superlink",
            "--ssl-certfile", str(certs.server_cert),
            "--ssl-keyfile", str(certs.server_key),
            "--ssl-ca-certfile", str(certs.ca_cert),
            "--enable-supernode-auth",
            "--database", str(folder / "state.db"),
            "--log-file", str(flower_log),
            "--isolation", "subprocess",
            "--host", host, "--port", str(port),
            "--disable-runtime-dependency-installation",
        ]
        daemon = _spawn(command, flower_env(folder / "flwr-home"), folder / "superlink.stdout",
                        "flower-superlink", cwd=folder)
        link = cls(process=daemon.process, log_file=daemon.log_file, name=daemon.name,
                   log_offset=daemon.log_offset, host=host, port=port,
                   ca_cert=certs.ca_cert, flower_log=flower_log)
        link.wait_healthy(startup_timeout)
        return link

    def wait_healthy(self, timeout: float) -> None:
        """Poll ``https://host:port/health`` (verified against the CA) until it answers."""
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        dial = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        url = f"https://{dial}:{self.port}/health"
        errors: list[str] = []

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(url, timeout=2.0, context=context) as response:
                    return response.status == 200
            except OSError as exc:  # URLError, refused, TLS not up yet
                errors.append(str(exc))
                return False

        if not _poll(healthy, timeout, watch=[self], interval=0.3):
            self.stop()
            raise FlowerProcessError(f"flower-superlink not healthy on {url} after "
                                     f"{timeout:.0f} s ({errors[-1:]}); see {self.log_file}")


@dataclass
class SuperNodeProcess(DaemonProcess):
    """A hospital's ``flower-supernode``: TLS to the SuperLink, authenticated by its key."""

    site: str = ""
    port: int = 0

    @classmethod
    def start(cls, layout: DeployLayout, site: str, superlink: str, data_path: Path,
              state_dir: Path | None = None, port: int | None = None,
              private_key: Path | None = None, torch_threads: int = 0,
              max_wait_time: float | None = None) -> SuperNodeProcess:
        """Start the SuperNode of ``site`` (returns at once; it connects in the background).

        Parameters
        ----------
        layout : DeployLayout
            The deployment folder (CA certificate, the site's key, logs).
        site : str
            Site name, sent to the ClientApp as node_config ``site-name``.
        superlink : str
            ``host:port`` of the SuperLink; the host must be one of its certificate's names.
        data_path, state_dir : Path
            Absolute site data folder (with ``manifest.csv``) and state folder
            (default ``supernodes/<site>/state``).
        port : int, optional
            Port of the SuperNode's own runtime API on 127.0.0.1 (free port if None);
            several SuperNodes on one machine need distinct ports.
        private_key : Path, optional
            Default ``certs/sites/<site>/supernode.key``.
        torch_threads : int
            CPU threads for training (0: torch's default).
        max_wait_time : float, optional
            Give up connecting to the SuperLink after this many seconds (default: never).
        """
        data_path = Path(data_path)
        if not (data_path / "manifest.csv").is_file():
            raise FlowerProcessError(f"{data_path} has no manifest.csv (see clients/manifest.py)")
        folder = layout.supernode_dir(site)
        state_dir = Path(state_dir) if state_dir else folder / "state"
        key = Path(private_key) if private_key else layout.private_key(site)
        if not key.is_file():
            raise FlowerProcessError(f"missing the SuperNode key {key}; run "
                                     f"`python -m app.certs --out {layout.certs} --sites {site}`")
        if not layout.ca_cert.is_file():
            raise FlowerProcessError(f"missing {layout.ca_cert} (the coordinator's ca.crt)")
        state_dir.mkdir(parents=True, exist_ok=True)
        port = port or free_port()
        command = [
            "flower-supernode",
            "--superlink", superlink,
            "--root-certificates", str(layout.ca_cert),
            "--auth-supernode-private-key", str(key),
            "--node-config", node_config_string(data_path, state_dir, site),
            "--isolation", "subprocess",
            "--host", "127.0.0.1", "--port", str(port),
        ]
        if max_wait_time is not None:
            command += ["--max-wait-time", str(max_wait_time)]
        extra = {"FEDMED_TORCH_THREADS": str(torch_threads)} if torch_threads else {}
        daemon = _spawn(command, flower_env(folder / "flwr-home", extra),
                        folder / "supernode.log", f"flower-supernode {site}", cwd=folder)
        return cls(process=daemon.process, log_file=daemon.log_file, name=daemon.name,
                   log_offset=daemon.log_offset, site=site, port=port)


# --- flwr CLI -------------------------------------------------------------------------


def _flwr(flwr_home: Path, args: list[str], timeout: float = 60.0
          ) -> subprocess.CompletedProcess:
    flwr_home.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["flwr", *args], env=flower_env(flwr_home), capture_output=True,
                          text=True, timeout=timeout, check=False, cwd=flwr_home)


def _json_out(result: subprocess.CompletedProcess) -> dict:
    """The JSON object a ``flwr ... --format json`` call printed (or {})."""
    text = result.stdout
    start = text.find("{")
    try:
        return json.loads(text[start:]) if start >= 0 else {}
    except json.JSONDecodeError:
        return {}


def _cli_error(result: subprocess.CompletedProcess, payload: dict) -> str:
    """The readable part of a failed ``flwr`` call."""
    text = str(payload.get("error-message") or (result.stdout + result.stderr))
    lines = [line.strip(" │╭╮╰╯─") for line in text.splitlines()]
    noise = ("Using SuperLink", "Listing all nodes")
    return " ".join(line for line in lines if line and not any(n in line for n in noise))


def _read_registry(path: Path) -> dict[str, dict]:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise FlowerProcessError(f"cannot read the site registry {path}: {exc}") from exc


def register_site(layout: DeployLayout, flwr_home: Path, site: str,
                  public_key: Path | None = None, connection: str = CONNECTION) -> int:
    """Register ``site``'s public key with the SuperLink; returns its node id.

    Idempotent: a key registered before (recorded in ``sites.json``) returns its
    node id. Flower keeps no site names, so the name -> node id map is kept in
    ``superlink/sites.json`` next to the SuperLink's database.
    """
    check_site_name(site)
    public_key = Path(public_key) if public_key else layout.public_key(site)
    if not public_key.is_file():
        raise FlowerProcessError(f"public key {public_key} not found; the hospital sends "
                                 "its supernode.pub (never its private key)")
    key_text = public_key.read_text(encoding="utf-8").split()
    key_id = " ".join(key_text[:2])
    registry = _read_registry(layout.registry)
    owner = next((name for name, entry in registry.items()
                  if entry.get("public-key") == key_id), None)
    if owner not in (None, site):
        raise FlowerProcessError(f"this key is already registered for site {owner}; "
                                 "every site needs its own key pair")
    known = registry.get(site)
    if known and known.get("public-key") != key_id:
        raise FlowerProcessError(
            f"site {site} is already registered as node {known['node-id']} with another "
            f"key; unregister it first: flwr supernode unregister {known['node-id']} "
            f"{connection}, then remove it from {layout.registry}")
    result = _flwr(flwr_home, ["supernode", "register", str(public_key), connection,
                               "--name", site, "--format", "json"])
    payload = _json_out(result)
    in_use = _KEY_IN_USE in result.stdout + result.stderr
    if payload.get("success"):
        node_id = int(payload["node-id"])
    elif in_use and known:
        return int(known["node-id"])
    elif in_use:
        raise FlowerProcessError(
            f"the key of {site} is registered already but not in {layout.registry}; "
            f"find its node id with `flwr supernode list {connection}`")
    else:
        raise FlowerProcessError(f"flwr supernode register failed: "
                                 f"{_cli_error(result, payload)}")
    registry[site] = {"node-id": str(node_id), "public-key": key_id,
                      "registered-at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    layout.registry.parent.mkdir(parents=True, exist_ok=True)
    tmp = layout.registry.with_suffix(".tmp")
    tmp.write_text(json.dumps(registry, indent=2) + "\n", encoding="utf-8")
    tmp.replace(layout.registry)
    return node_id


def list_supernodes(flwr_home: Path, connection: str = CONNECTION) -> list[dict]:
    """The SuperLink's SuperNodes as ``flwr supernode list --format json`` reports them."""
    result = _flwr(flwr_home, ["supernode", "list", connection, "--format", "json"])
    payload = _json_out(result)
    if not payload.get("success"):
        raise FlowerProcessError(f"flwr supernode list failed: {_cli_error(result, payload)}")
    return list(payload.get("nodes", []))


def wait_online(flwr_home: Path, node_ids: Iterable[int], timeout: float,
                connection: str = CONNECTION,
                watch: Sequence[DaemonProcess] = ()) -> None:
    """Wait until every node id is ``online`` at the SuperLink (bounded).

    Daemons in ``watch`` (the SuperNodes) make it fail early if one exits, and
    the SuperLink is only asked (one ``flwr`` process per poll) once each of
    them has logged its ``SuperNode ID``.
    """
    wanted = {str(n) for n in node_ids}
    online: set[str] = set()

    def all_online() -> bool:
        if not all(_NODE_ID_LINE in daemon.log_text() for daemon in watch):
            return False
        online.clear()
        online.update(n["node-id"] for n in list_supernodes(flwr_home, connection)
                      if n.get("status") == "online")
        return wanted <= online

    if not _poll(all_online, timeout, watch=watch):
        raise FlowerProcessError(f"SuperNodes {sorted(wanted - online)} not online after "
                                 f"{timeout:.0f} s")


@dataclass(frozen=True)
class RunOutcome:
    """What ``flwr run`` started and how it ended."""

    run_id: int | None
    status: str


def submit_run(flwr_home: Path, run_config: str, timeout: float,
               connection: str = CONNECTION, project: Path = PROJECT_ROOT,
               on_line: Callable[[str], None] | None = None,
               env_extra: dict[str, str] | None = None,
               status_timeout: float = 60.0) -> RunOutcome:
    """``flwr run <project> <connection> --stream``; wait (bounded) for the final status.

    ``flwr run`` exits 0 even when the run failed, so the status comes from
    ``flwr ls --run-id ID --format json``. A run still going at ``timeout`` is
    stopped with ``flwr stop``.
    """
    command = ["flwr", "run", str(project), connection, "--stream", "--run-config", run_config]
    process = subprocess.Popen(command, env=flower_env(flwr_home, env_extra),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               cwd=project, start_new_session=True)
    found: list[int] = []

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            match = _RUN_ID.search(line)
            if match and not found:
                found.append(int(match.group(1)))
            if on_line is not None:
                on_line(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        stop_process_group(process)
        reader.join(timeout=10.0)
    if not found:
        return RunOutcome(None, "not-started")
    run_id = found[0]
    if timed_out:
        _flwr(flwr_home, ["stop", str(run_id), connection])
    # The stream can end a moment before the SuperLink records the final status.
    deadline = time.monotonic() + status_timeout
    status = run_status(flwr_home, connection, run_id)
    while not status.startswith("finished") and time.monotonic() < deadline:
        time.sleep(1.0)
        status = run_status(flwr_home, connection, run_id)
    return RunOutcome(run_id, status)


# --- command line ---------------------------------------------------------------------


def _foreground(daemon: DaemonProcess, banner: str) -> int:
    """Print the daemon's log as it grows until it exits or we are interrupted."""
    print(banner, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    position = daemon.log_offset
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
                sys.stdout.write(chunk.decode("utf-8", errors="replace"))
                sys.stdout.flush()
            if daemon.process.poll() is not None:
                print(f"{daemon.name} exited with code {daemon.process.returncode}")
                return daemon.process.returncode or 1
            stop.wait(0.5)
    finally:
        if daemon.process.poll() is None:
            print(f"\nstopping {daemon.name} (pid {daemon.pid})...", flush=True)
        daemon.stop()
    return 0


def _superlink_address(args: argparse.Namespace) -> str:
    return args.superlink or f"127.0.0.1:{args.port}"


def _connected_layout(args: argparse.Namespace) -> DeployLayout:
    """The deployment folder, with the CLI's TLS connection (re)written for it."""
    layout = DeployLayout(args.deploy_dir)
    write_tls_connection(args.flwr_home, CONNECTION, _superlink_address(args), layout.ca_cert)
    return layout


def _cmd_superlink(args: argparse.Namespace) -> int:
    link = TLSSuperLink.start(DeployLayout(args.deploy_dir), host=args.host, port=args.port)
    try:
        layout = _connected_layout(args)
    except FlowerProcessError:
        link.stop()
        raise
    return _foreground(link, (
        f"SuperLink on https://{link.address} (TLS, SuperNode authentication on), pid "
        f"{link.pid}\n  database {layout.superlink_dir / 'state.db'}\n  log      "
        f"{link.flower_log}\n  CLI      FLWR_HOME={args.flwr_home} "
        f"{Path(sys.executable).parent / 'flwr'} supernode list {CONNECTION}\n"
        "Ctrl-C stops it."))


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
                                  torch_threads=args.torch_threads)
    return _foreground(node, (
        f"SuperNode {args.site} -> {_superlink_address(args)} (pid {node.pid}, runtime API "
        f"127.0.0.1:{node.port})\n  data {args.data.resolve()}\n  log  {node.log_file}\n"
        "Ctrl-C stops it."))


def _cmd_nodes(args: argparse.Namespace) -> int:
    layout = _connected_layout(args)
    names = {v["node-id"]: k for k, v in _read_registry(layout.registry).items()}
    nodes = list_supernodes(args.flwr_home)
    print(f"{'site':<16} {'node id':<22} status")
    for node in nodes:
        print(f"{names.get(node['node-id'], '?'):<16} {node['node-id']:<22} {node['status']}")
    return 0


def _cmd_federate(args: argparse.Namespace) -> int:
    from app.simulate import print_summary, build_run_config  # noqa: PLC0415

    layout = _connected_layout(args)
    run_config = build_run_config(args.run_config, args.data_root, args.tracking_uri,
                                  args.artifact_root, args.preset)
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
    print_summary(args.tracking_uri, outcome.run_id, time.monotonic() - started)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, cli: bool = True) -> None:
        p.add_argument("--deploy-dir", type=Path, default=PROJECT_ROOT / "deploy")
        p.add_argument("--port", type=int, default=DEFAULT_PORT,
                       help="the SuperLink's HTTPS port")
        p.add_argument("--superlink", default=None,
                       help="host:port the SuperLink is dialled at (a name in its "
                            "certificate); default 127.0.0.1:PORT")
        if cli:
            p.add_argument("--flwr-home", type=Path, default=PROJECT_ROOT / ".flwr-deploy")

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
    p.add_argument("--data", type=Path, required=True, help="site folder with manifest.csv")
    p.add_argument("--state", type=Path, default=None)
    p.add_argument("--runtime-port", type=int, default=None,
                   help="the SuperNode's local runtime API port (default: a free one)")
    p.add_argument("--private-key", type=Path, default=None)
    p.add_argument("--torch-threads", type=int, default=0)
    p.set_defaults(func=_cmd_supernode)

    p = sub.add_parser("nodes", help="list SuperNodes with their site names")
    common(p)
    p.set_defaults(func=_cmd_nodes)

    p = sub.add_parser("federate", help="run the app on the deployment, check its status")
    common(p)
    p.add_argument("--tracking-uri", required=True)
    p.add_argument("--artifact-root", type=Path, required=True)
    p.add_argument("--data-root", type=Path, default=PROJECT_ROOT / "data",
                   help="run-config data-root (simulation only; sites use node_config)")
    p.add_argument("--preset", type=Path, default=None)
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("-c", "--run-config", action="append", default=[], metavar="KEY=VALUE")
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
    except (FlowerProcessError, CertError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
