"""A Flower daemon started by us: its own process group, its log, bounded waits."""

from __future__ import annotations

import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.tooling.errors import FlowerProcessError
from app.tooling.process_tree import descendants, stop_pids, stop_process_group

__all__ = ["DaemonProcess", "spawn_daemon", "poll_until"]


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
        stop_pids(helpers, timeout=5.0)

    def log_text(self) -> str:
        """What it logged since it started (its log file is appended to)."""
        try:
            with open(self.log_file, "rb") as handle:
                handle.seek(self.log_offset)
                return handle.read().decode("utf-8", errors="replace")
        except OSError:
            return ""


def spawn_daemon(command: list[str], env: dict[str, str], log_file: Path, name: str,
                 cwd: Path) -> DaemonProcess:
    """Start ``command`` in a new session, its output appended to ``log_file``."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        offset = out.tell()
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   cwd=cwd, start_new_session=True)
    return DaemonProcess(process=process, log_file=log_file, name=name, log_offset=offset)


def poll_until(check: Callable[[], bool], timeout: float, watch: Sequence[DaemonProcess] = (),
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


def wait_until_healthy(daemon: DaemonProcess, url: str, timeout: float,
                       context: ssl.SSLContext | None = None) -> None:
    """Poll ``url`` (a ``/health`` endpoint) every 0.3 s until it answers 200.

    Raises
    ------
    FlowerProcessError
        As soon as ``daemon`` exits, or after ``timeout`` s (``daemon`` stopped first):
        ``<name> not healthy on <url> after <t> s (<last error>); see <log file>``.
    """
    errors: list[str] = []

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2.0, context=context) as response:
                return response.status == 200
        except OSError as exc:  # URLError, refused, TLS not up yet
            errors.append(str(exc))
            return False

    if not poll_until(healthy, timeout, watch=[daemon], interval=0.3):
        daemon.stop()
        raise FlowerProcessError(f"{daemon.name} not healthy on {url} after "
                                 f"{timeout:.0f} s ({errors[-1:]}); see {daemon.log_file}")
