"""The one ``flower-superlink`` wrapper, for simulation and for a deployment.

* :meth:`SuperLinkProcess.start_simulation` (``make simulate``): insecure, on a
  free loopback port, simulation mode; its logs go to a log folder.
* :meth:`SuperLinkProcess.start_tls` (``make superlink``, the deployment tests):
  TLS with the deployment's CA, SuperNode authentication, a sqlite database;
  its logs and database live in ``<deploy>/superlink/``.

Both run with ``--isolation subprocess`` and no runtime dependency
installation, in their own process group; :meth:`DaemonProcess.stop` stops the
SuperLink and every process it started (ServerApp, Ray workers) by PID.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from app.tooling.certs import cert_paths
from app.tooling.daemon import DaemonProcess, spawn_daemon, wait_until_healthy
from app.tooling.environment import flower_env, free_port
from app.tooling.errors import FlowerProcessError
from app.tooling.layout import DeployLayout
from app.tooling.state_migrations import COORDINATOR, migrate_folder

__all__ = ["SuperLinkProcess", "DEFAULT_PORT"]

DEFAULT_PORT = 8000


@dataclass
class SuperLinkProcess(DaemonProcess):
    """A ``flower-superlink`` we started; TLS when ``ca_cert`` is set, else insecure."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    ca_cert: Path | None = None
    flower_log: Path = Path()

    @property
    def address(self) -> str:
        """``host:port`` of its one port (Fleet, Control and runtime APIs)."""
        return f"{self.host}:{self.port}"

    @classmethod
    def start_simulation(cls, flwr_home: Path, log_dir: Path,
                         startup_timeout: float = 180.0) -> SuperLinkProcess:
        """Start an insecure simulation-mode SuperLink on a free loopback port, wait for it.

        Its Flower log is ``log_dir/superlink.log``, its output ``log_dir/superlink.stdout``.
        """
        return cls._launch(["--insecure", "--simulation"], folder=log_dir,
                           flwr_home=flwr_home, host="127.0.0.1", port=free_port(),
                           ca_cert=None, startup_timeout=startup_timeout)

    @classmethod
    def start_tls(cls, layout: DeployLayout, host: str = "127.0.0.1",
                  port: int | None = None, startup_timeout: float = 180.0) -> SuperLinkProcess:
        """Start the deployment's TLS SuperLink on ``host:port`` (a free port if None).

        Uses the certificates of ``layout.certs`` (``make certs``), enables
        SuperNode authentication and keeps its state in ``superlink/state.db``; a
        folder of an older release is migrated first, one of a newer release refused
        (:func:`~app.tooling.state_migrations.migrate_folder`).
        """
        certs = cert_paths(layout.certs)
        missing = [p for p in (certs.ca_cert, certs.server_cert, certs.server_key)
                   if not p.is_file()]
        if missing:
            raise FlowerProcessError(f"missing {', '.join(map(str, missing))}; run `make certs`")
        folder = layout.superlink_dir
        folder.mkdir(parents=True, exist_ok=True)
        migrate_folder(folder, COORDINATOR)  # a previous release's folder: its migrations
        options = [
            "--ssl-certfile", str(certs.server_cert),
            "--ssl-keyfile", str(certs.server_key),
            "--ssl-ca-certfile", str(certs.ca_cert),
            "--enable-supernode-auth",
            "--database", str(folder / "state.db"),
        ]
        return cls._launch(options, folder=folder, flwr_home=folder / "flwr-home", host=host,
                           port=port or free_port(), ca_cert=certs.ca_cert,
                           startup_timeout=startup_timeout)

    @classmethod
    def _launch(cls, options: list[str], folder: Path, flwr_home: Path, host: str, port: int,
                ca_cert: Path | None, startup_timeout: float) -> SuperLinkProcess:
        folder.mkdir(parents=True, exist_ok=True)
        flower_log = folder / "superlink.log"
        command = [
            "flower-superlink", *options,
            "--log-file", str(flower_log),
            "--isolation", "subprocess",
            "--host", host, "--port", str(port),
            "--disable-runtime-dependency-installation",
        ]
        daemon = spawn_daemon(command, flower_env(flwr_home), folder / "superlink.stdout",
                              "flower-superlink", cwd=folder)
        link = cls(process=daemon.process, log_file=daemon.log_file, name=daemon.name,
                   log_offset=daemon.log_offset, host=host, port=port, ca_cert=ca_cert,
                   flower_log=flower_log)
        link.wait_healthy(startup_timeout)
        return link

    def wait_healthy(self, timeout: float) -> None:
        """Poll ``/health`` (over TLS verified against the CA, if any) until it answers."""
        dial = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        scheme = "https" if self.ca_cert is not None else "http"
        url = f"{scheme}://{dial}:{self.port}/health"
        context = (ssl.create_default_context(cafile=str(self.ca_cert))
                   if self.ca_cert is not None else None)
        wait_until_healthy(self, url, timeout, context)
