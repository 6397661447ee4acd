"""A local ``mlflow server`` (a real HTTP tracking server) started and stopped by PID.

:meth:`MlflowServerProcess.start` runs ``mlflow server`` on a loopback port with
a given backend store (``sqlite:///...``) and artifact folder, in its own
process group (its uvicorn workers with it), and waits for ``/health``.
:meth:`MlflowServerProcess.kill` stops it the way a crash or an outage would
(SIGKILL, no shutdown), :meth:`DaemonProcess.stop` the polite way; a server can
be started again on the same port and store (:meth:`restart`). The end-to-end
test ``tests/integration/test_simulation.py`` uses it to stop MLflow mid-run.
"""

from __future__ import annotations

import os
import signal
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from app.processes.daemon import DaemonProcess, poll_until, spawn_daemon
from app.processes.environment import free_port
from app.processes.errors import FlowerProcessError
from app.processes.process_tree import descendants, stop_pids

__all__ = ["MlflowServerProcess"]


@dataclass
class MlflowServerProcess(DaemonProcess):
    """An ``mlflow server`` we started on ``127.0.0.1:port``."""

    port: int = 0
    backend_store_uri: str = ""
    artifact_root: Path = Path()

    @property
    def uri(self) -> str:
        """Its tracking URI (``http://127.0.0.1:<port>``)."""
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, backend_store_uri: str, artifact_root: Path, log_file: Path,
              port: int | None = None, startup_timeout: float = 60.0) -> MlflowServerProcess:
        """Start ``mlflow server`` (one worker) on ``port`` (a free one if None), wait for it.

        Its output is appended to ``log_file``; artifacts it serves go to
        ``artifact_root``. Raises :class:`FlowerProcessError` naming the log
        when it does not answer ``/health`` within ``startup_timeout`` seconds.
        """
        port = port or free_port()
        artifact_root.mkdir(parents=True, exist_ok=True)
        command = [
            str(Path(sys.executable).parent / "mlflow"), "server",
            "--backend-store-uri", backend_store_uri,
            "--artifacts-destination", str(artifact_root),
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        daemon = spawn_daemon(command, env, log_file, "mlflow server", cwd=artifact_root)
        server = cls(process=daemon.process, log_file=daemon.log_file, name=daemon.name,
                     log_offset=daemon.log_offset, port=port,
                     backend_store_uri=backend_store_uri, artifact_root=artifact_root)
        server.wait_healthy(startup_timeout)
        return server

    def restart(self, startup_timeout: float = 60.0) -> MlflowServerProcess:
        """A new server on the same port, store and log (this one must be stopped)."""
        return MlflowServerProcess.start(self.backend_store_uri, self.artifact_root,
                                         self.log_file, self.port, startup_timeout)

    def wait_healthy(self, timeout: float) -> None:
        """Poll ``/health`` until it answers 200; stop it and raise if it never does."""
        url = f"{self.uri}/health"
        errors: list[str] = []

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(url, timeout=2.0) as response:
                    return response.status == 200
            except OSError as exc:  # refused while starting
                errors.append(str(exc))
                return False

        if not poll_until(healthy, timeout, watch=[self], interval=0.3):
            self.stop()
            raise FlowerProcessError(f"mlflow server not healthy on {url} after "
                                     f"{timeout:.0f} s ({errors[-1:]}); see {self.log_file}")

    def kill(self) -> None:
        """SIGKILL its process group and every process it started (an abrupt outage)."""
        helpers = descendants(self.process.pid)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=15.0)
        stop_pids(helpers, timeout=0.0)
