"""The site runner's warm workers: one process per (approved app bundle, imaging task).

:class:`WorkerPool` starts a worker (the script :mod:`app.site_runtime.site_worker`)
on first use, sends it jobs over a socket pair and keeps at most ``max_workers``
alive, stopping the least recently used one to make room. A worker that dies is
dropped and started afresh on the next message.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from collections import OrderedDict
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

__all__ = ["WorkerPool", "WORKER_SCRIPT"]

log = logging.getLogger("fedmed.site_runner")

#: The worker runs as a script (see :mod:`app.site_runtime.site_worker`).
WORKER_SCRIPT = Path(__file__).with_name("site_worker.py")


class _Worker:
    """One warm worker process and its socket."""

    def __init__(self, key: tuple[str, str], env: dict[str, str] | None) -> None:
        ours, theirs = socket.socketpair()
        self.key = key
        self.process = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, str(WORKER_SCRIPT), "--fd", str(theirs.fileno()),
             "--parent-pid", str(os.getpid())],
            pass_fds=[theirs.fileno()], env=env)
        theirs.close()
        self.connection = Connection(ours.detach())
        log.info("started warm worker %d for app %s, task %r",
                 self.process.pid, key[0][:12], key[1])

    def run(self, job: dict[str, Any]) -> tuple:
        """Send ``job``; ``("done", ...)``, ``("failed", ...)`` or ``("crashed", exit code)``."""
        try:
            self.connection.send(job)
            while not self.connection.poll(0.5):
                if self.process.poll() is not None:
                    return ("crashed", self.process.returncode)
            return self.connection.recv()
        except (EOFError, OSError, BrokenPipeError):
            return ("crashed", self.process.wait(timeout=10))

    def stop(self) -> None:
        """Close the socket (the worker exits) and reap the process."""
        self.connection.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class WorkerPool:
    """Warm workers keyed by (FAB hash, imaging task), at most ``max_workers`` alive.

    Parameters
    ----------
    max_workers : int
        Workers kept at once; the least recently used one is stopped beyond it.
    env : dict, optional
        Environment of the workers (default: the runner's).
    """

    def __init__(self, max_workers: int = 2, env: dict[str, str] | None = None) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers = max_workers
        self.env = env
        self._workers: OrderedDict[tuple[str, str], _Worker] = OrderedDict()
        self.started = 0

    def run(self, key: tuple[str, str], job: dict[str, Any]) -> tuple:
        """Run ``job`` on the worker of ``key`` (started if needed); a crashed one is dropped."""
        worker = self._workers.pop(key, None)
        if worker is None:
            while len(self._workers) >= self.max_workers:
                _, oldest = self._workers.popitem(last=False)
                oldest.stop()
            worker = _Worker(key, self.env)
            self.started += 1
        outcome = worker.run(job)
        if outcome[0] == "crashed":
            log.error("warm worker %d of app %s exited with code %s; a new one starts on "
                      "the next message", worker.process.pid, key[0][:12], outcome[1])
            worker.stop()
        else:
            self._workers[key] = worker
        return outcome

    def discard(self, fab_hash: str) -> None:
        """Stop every worker of the bundle ``fab_hash`` (its code may have changed)."""
        for key in [key for key in self._workers if key[0] == fab_hash]:
            self._workers.pop(key).stop()

    def close(self) -> None:
        """Stop every worker."""
        while self._workers:
            self._workers.popitem()[1].stop()
