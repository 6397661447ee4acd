"""Start and stop real Flower processes (SuperLink) and drive the `flwr` CLI.

Used by ``python -m app.simulate`` and the integration tests. Every process is
started in its own process group and stopped by PID with bounded waits, so a
run never leaves a SuperLink (or its Ray workers) behind. Environment for all
of them: a project-local ``FLWR_HOME``, no runtime dependency installation
(a SuperLink would otherwise ``uv sync`` the app and pull a CUDA torch), no
telemetry, no update check.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from strategies.errors import FederationError

__all__ = [
    "FlowerProcessError",
    "flower_env",
    "free_port",
    "SuperLinkProcess",
    "write_connection",
    "run_status",
    "stop_process_group",
]


class FlowerProcessError(FederationError):
    """A Flower process failed to start, or a run did not complete."""


def flower_env(flwr_home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for Flower daemons and CLI calls of this project."""
    env = dict(os.environ)
    env.update({
        "FLWR_HOME": str(flwr_home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
        "PYTHONUNBUFFERED": "1",
    })
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env.update(extra or {})
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process_group(process: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM the process group, then SIGKILL it after ``timeout`` seconds."""
    if process.poll() is not None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=timeout)


@dataclass
class SuperLinkProcess:
    """A ``flower-superlink`` started by us (insecure loopback, simulation mode)."""

    process: subprocess.Popen
    port: int
    log_file: Path

    @property
    def address(self) -> str:
        """``host:port`` of its HTTP API (Control, Fleet and runtime)."""
        return f"127.0.0.1:{self.port}"

    @classmethod
    def start_simulation(cls, flwr_home: Path, log_dir: Path,
                         startup_timeout: float = 60.0) -> SuperLinkProcess:
        """Start a simulation-mode SuperLink on a free loopback port and wait for it."""
        log_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        log_file = log_dir / "superlink.log"
        command = [
            "flower-superlink", "--insecure", "--simulation",
            "--isolation", "subprocess",
            "--host", "127.0.0.1", "--port", str(port),
            "--disable-runtime-dependency-installation",
            "--log-file", str(log_file),
        ]
        with open(log_dir / "superlink.stdout", "wb") as out:
            process = subprocess.Popen(command, env=flower_env(flwr_home), stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        link = cls(process=process, port=port, log_file=log_file)
        link.wait_healthy(startup_timeout)
        return link

    def wait_healthy(self, timeout: float) -> None:
        """Poll ``/health`` until it answers, the process dies, or ``timeout``."""
        deadline = time.monotonic() + timeout
        url = f"http://{self.address}/health"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise FlowerProcessError(
                    f"flower-superlink exited with code {self.process.returncode}; "
                    f"see {self.log_file}")
            try:
                with urllib.request.urlopen(url, timeout=1.0) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        self.stop()
        raise FlowerProcessError(f"flower-superlink not healthy after {timeout:.0f} s; "
                                 f"see {self.log_file}")

    def stop(self) -> None:
        """Stop the SuperLink and everything it started (ServerApp, Ray)."""
        stop_process_group(self.process)


def write_connection(flwr_home: Path, name: str, address: str) -> None:
    """Write ``FLWR_HOME/config.toml`` with one insecure SuperLink connection, the default."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "{name}"\n\n'
        f'[superlink.{name}]\naddress = "{address}"\ninsecure = true\n',
        encoding="utf-8")


def run_status(flwr_home: Path, connection: str, run_id: int) -> str:
    """Status of a run as ``flwr ls --format json`` reports it (e.g. ``finished:completed``).

    ``flwr run`` exits 0 even when the run failed; this is the check that counts.
    """
    flwr = shutil.which("flwr", path=flower_env(flwr_home)["PATH"]) or "flwr"
    out = subprocess.run(
        [flwr, "ls", connection, "--run-id", str(run_id), "--format", "json"],
        env=flower_env(flwr_home), capture_output=True, text=True, timeout=60, check=False)
    try:
        payload = json.loads(out.stdout)
        return str(payload["runs"][0]["status"])
    except (json.JSONDecodeError, KeyError, IndexError) as exc:
        raise FlowerProcessError(
            f"cannot read the status of run {run_id}: {out.stdout or out.stderr}") from exc
