"""A hospital's ``flower-supernode``: TLS to the SuperLink, authenticated by its own key.

By default it runs as :mod:`app.site_runtime.site_node`: the SuperNode with the
hospital's site runner, which runs only app bundles the site policy approves,
in warm workers (``runner="warm"``). ``runner="flower"`` is Flower's own
executor (one ``flwr-clientapp`` process per message, any bundle), kept for the
before/after benchmark (``bench/site_overhead.py``).

The site's data folder and state folder reach the ClientApp as node_config
(``data-path``, ``state-dir``, ``site-name``, ``policy-path``: the hospital's site
policy, :mod:`clients.site.policy`, and, when given, ``state-retention-days``,
:mod:`clients.site.state_retention`); they are absolute because the daemon does
not run in the project directory. A site whose dataset is a PACS cohort is started with
its cohort file as ``data_path`` (``make supernode DATA=/abs/cohort.toml``): the node config
then names it as ``cohort`` and, as ``data-path``, the folder the site runtime syncs it
into, ``<state-dir>/pacs/<name>`` (:mod:`app.site_runtime.pacs_sync`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from app.config.site_config import COHORT
from app.tooling.certs import check_site_name
from app.tooling.daemon import DaemonProcess, spawn_daemon
from app.tooling.environment import flower_env, free_port
from app.tooling.errors import FlowerProcessError
from app.tooling.layout import DeployLayout
from app.tooling.state_migrations import SITE_STATE, migrate_folder
from app.site_runtime.site_proxy import proxy_env
from clients.pacs.cohort import load_cohort
from clients.pacs.sync import store_dir
from clients.ct3d_cls.manifest import MANIFEST_NAME as CT3D_MANIFEST
from clients.cxr_cls.manifest import MANIFEST_NAME as CXR_MANIFEST
from clients.datagen.vertical_sets import SITE_FILE as VERTICAL_SITE_FILE
from clients.pe_seg.manifest import MANIFEST_NAME as PE_MANIFEST
from clients.site.policy import load_policy
from clients.tabular.table import TABLE_NAME

__all__ = ["SITE_INDEX_FILES", "SuperNodeProcess", "node_config_string", "site_folder_problem"]


def node_config_string(data_path: Path, state_dir: Path, site: str,
                       policy: Path | None = None,
                       state_retention_days: float | None = None,
                     cohort: Path | None = None) -> str:
    """``--node-config`` value for a hospital SuperNode (absolute paths, quoted)."""
    paths = [("data", data_path), ("state", state_dir)] + ([("policy", policy)] if policy else [])
    paths += [("cohort", cohort)] if cohort else []
    for label, path in paths:
        if not Path(path).is_absolute():
            raise FlowerProcessError(f"{label} path must be absolute, got {str(path)!r}")
        if '"' in str(path) or "\\" in str(path):
            raise FlowerProcessError(f"{label} path must not contain quotes or "
                                     f"backslashes: {str(path)!r}")
    if state_retention_days is not None and not state_retention_days >= 0:
        raise FlowerProcessError(f"state-retention-days must be >= 0 (0 keeps all), got "
                                 f"{state_retention_days}")
    return (f'data-path="{data_path}" state-dir="{state_dir}" '
            f'site-name="{check_site_name(site)}"'
            + (f' policy-path="{policy}"' if policy else "")
            + (f' {COHORT}="{cohort}"' if cohort else "")
            + (f" state-retention-days={float(state_retention_days)}"
               if state_retention_days is not None else ""))


#: The index file of each task's site folder, from the tasks' own modules (a vertical
#: site declares itself in a file).
SITE_INDEX_FILES = (PE_MANIFEST, CXR_MANIFEST, CT3D_MANIFEST, TABLE_NAME, VERTICAL_SITE_FILE)


def site_folder_problem(data_path: Path) -> str | None:
    """Why ``data_path`` cannot be a site's data folder (``None``: it can): missing, not a
    folder, or without the index file of any task (:data:`SITE_INDEX_FILES`)."""
    if not data_path.exists():
        return f"site data folder {data_path} does not exist"
    if not data_path.is_dir():
        return f"site data folder {data_path} is not a folder"
    if any((data_path / name).is_file() for name in SITE_INDEX_FILES):
        return None
    return (f"{data_path} holds no site index file: a site folder holds one of "
            f"{', '.join(SITE_INDEX_FILES)} (docs/DATA.md)")

@dataclass
class SuperNodeProcess(DaemonProcess):
    """A hospital's ``flower-supernode``: TLS to the SuperLink, authenticated by its key."""

    site: str = ""
    port: int = 0

    @classmethod
    def start(cls, layout: DeployLayout, site: str, superlink: str, data_path: Path,
              state_dir: Path | None = None, port: int | None = None,
              private_key: Path | None = None, torch_threads: int = 0,
              max_wait_time: float | None = None, policy: Path | None = None,
              runner: str = "warm", poll_interval: float = 0.25,
              state_retention_days: float | None = None,
              console_port: int | None = None,
              worker_uid: int | None = None,
              proxy: str | None = None) -> SuperNodeProcess:
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
            Absolute site data folder (with ``manifest.csv``), or PACS cohort file
            (``*.toml``, :mod:`clients.pacs.cohort`: synced by the site runner into
            ``<state_dir>/pacs/<name>``), and state folder (default
            ``supernodes/<site>/state``).
        port : int, optional
            Port of the SuperNode's own runtime API on 127.0.0.1 (free port if None);
            several SuperNodes on one machine need distinct ports.
        private_key : Path, optional
            Default ``certs/sites/<site>/supernode.key``.
        torch_threads : int
            CPU threads for training (0: torch's default).
        max_wait_time : float, optional
            Give up connecting to the SuperLink after this many seconds (default: never).
        policy : Path
            Absolute path of the site policy TOML: the site runner's ``--policy``
            and node_config ``policy-path`` (one file for apps and data); checked
            here so a bad file fails at start. Required with ``runner="warm"``;
            with ``runner="flower"`` (no app check) None is the permissive policy.
        runner : str
            ``"warm"``: the hospital's site runner (:mod:`app.site_runtime.site_node`);
            ``"flower"``: Flower's executor, one process per message, no app check.
        poll_interval : float
            With the site runner: cap of the SuperNode's poll waits (Flower: 3 s).
        state_retention_days : float, optional
            Node option ``state-retention-days``: days a federation's state folder
            is kept after its last change (None: the default, 30; 0: kept forever).
        console_port : int, optional
            With the site runner: serve the hospital's console
            (:mod:`app.site_runtime.console`) on ``127.0.0.1:<console_port>`` in the
            node process (``make supernode CONSOLE=1``).
        worker_uid : int, optional
            With the site runner started as root: the uid of its sandboxed workers
            (``make supernode WORKER_UID=``; default the site node's, 65534).
        proxy : str, optional
            ``http://host:port`` of the hospital's HTTP(S) proxy: the SuperNode's
            HTTPS to the SuperLink is tunnelled through it with CONNECT
            (:mod:`app.site_runtime.site_proxy`; None: the inherited environment).
        """
        if runner not in ("warm", "flower"):
            raise FlowerProcessError(f"runner must be 'warm' or 'flower', got {runner!r}")
        if console_port and runner != "warm":
            raise FlowerProcessError("the console runs in the site node: runner must be 'warm'")
        data_path = Path(data_path)
        if policy is None and runner == "warm":
            raise FlowerProcessError("the site runner needs the site policy: give policy="
                                     "/abs/policy.toml (make supernode POLICY=, default "
                                     "configs/site-policy.toml)")
        if policy is not None:
            load_policy(policy)
        proxied = proxy_env(proxy) if proxy is not None else {}  # checked before anything
        folder = layout.supernode_dir(site)
        state_dir = Path(state_dir) if state_dir else folder / "state"
        cohort = data_path if data_path.suffix == ".toml" and data_path.is_file() else None
        if cohort is not None:
            if runner != "warm":
                raise FlowerProcessError("a PACS cohort is synced by the site runner: runner "
                                         "must be 'warm'")
            data_path = store_dir(load_cohort(cohort), state_dir)  # the file checked here
        problem = site_folder_problem(data_path) if cohort is None else None
        if problem is not None:
            raise FlowerProcessError(problem)
        key = Path(private_key) if private_key else layout.private_key(site)
        if not key.is_file():
            raise FlowerProcessError(
                f"missing the SuperNode key {key}; run "
                f"`python -m app.tooling.certs --out {layout.certs} --sites {site}`")
        if not layout.ca_cert.is_file():
            raise FlowerProcessError(f"missing {layout.ca_cert} (the coordinator's ca.crt)")
        state_dir.mkdir(parents=True, exist_ok=True)
        migrate_folder(state_dir, SITE_STATE)  # a previous release's folder: its migrations
        port = port or free_port()
        command = [
            "--superlink", superlink,
            "--root-certificates", str(layout.ca_cert),
            "--auth-supernode-private-key", str(key),
            "--node-config", node_config_string(data_path, state_dir, site, policy,
                                                state_retention_days, cohort),
            "--host", "127.0.0.1", "--port", str(port),
        ]
        if max_wait_time is not None:
            command += ["--max-wait-time", str(max_wait_time)]
        if runner == "flower":
            command = ["flower-supernode", *command, "--isolation", "subprocess"]
        else:
            command = [sys.executable, "-m", "app.site_runtime.site_node",
                       *(["--policy", str(policy)] if policy else []),
                       "--poll-interval", str(poll_interval),
                       *(["--console-port", str(console_port)] if console_port else []),
                       *(["--worker-uid", str(worker_uid)] if worker_uid else []),
                       "--", *command]
        extra = {"FEDMED_TORCH_THREADS": str(torch_threads)} if torch_threads else {}
        extra.update(proxied)
        daemon = spawn_daemon(command, flower_env(folder / "flwr-home", extra),
                              folder / "supernode.log", f"flower-supernode {site}", cwd=folder)
        return cls(process=daemon.process, log_file=daemon.log_file, name=daemon.name,
                   log_offset=daemon.log_offset, site=site, port=port)
