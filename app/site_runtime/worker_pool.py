"""The site runner's warm workers: one process per (approved app bundle, imaging task, site).

:class:`WorkerPool` starts a worker (the script :mod:`app.site_runtime.site_worker`) on
first use, as its :class:`WorkerLaunch` says (in deployment: inside the sandbox,
:mod:`app.site_runtime.sandbox`), sends it jobs over a socket pair and keeps at most
``max_workers`` alive, stopping the least recently used one to make room. A worker that
dies is dropped and started afresh on the next message; one that runs a job for longer
than ``job_timeout`` seconds is killed (the sandbox's time limit).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

__all__ = ["WorkerLaunch", "WorkerPool", "WORKER_SCRIPT", "plain_launch"]

log = logging.getLogger("fedmed.site_runner")

#: The worker runs as a script (see :mod:`app.site_runtime.site_worker`).
WORKER_SCRIPT = Path(__file__).with_name("site_worker.py")
#: Seconds between two looks at a worker that is still busy.
_POLL = 0.5


@dataclass(frozen=True)
class WorkerLaunch:
    """How one worker starts.

    ``command(fd)`` is the whole command line, given the descriptor of the worker's
    end of the socket pair; ``env`` its environment (None: the runner's).
    """

    command: Callable[[int], list[str]]
    env: dict[str, str] | None = None
    #: Label for the site's log (``sandboxed`` or ``unsandboxed``).
    label: str = "unsandboxed"


def plain_launch(env: dict[str, str] | None = None) -> WorkerLaunch:
    """A worker as a plain subprocess of the runner (``sandbox = "off"``, tests of the pool)."""
    return WorkerLaunch(lambda fd: [sys.executable, str(WORKER_SCRIPT), "--fd", str(fd),
                                    "--parent-pid", str(os.getpid())], env)


class _Worker:
    """One warm worker process and its socket."""

    def __init__(self, key: Hashable, launch: WorkerLaunch) -> None:
        ours, theirs = socket.socketpair()
        self.key = key
        self.process = subprocess.Popen(  # pylint: disable=consider-using-with
            launch.command(theirs.fileno()), pass_fds=[theirs.fileno()], env=launch.env)
        theirs.close()
        self.connection = Connection(ours.detach())
        log.info("started warm worker %d (%s) for %s", self.process.pid, launch.label, key)

    def run(self, job: dict[str, Any], timeout: float | None) -> tuple:
        """Send ``job``; ``("done", ...)``, ``("failed", ...)``, ``("crashed", exit code)`` or
        ``("timeout", seconds)``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            self.connection.send(job)
            while not self.connection.poll(_POLL):
                if self.process.poll() is not None:
                    return ("crashed", self.process.returncode)
                if deadline is not None and time.monotonic() > deadline:
                    self.process.kill()
                    self.process.wait()
                    return ("timeout", timeout)
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
    """Warm workers keyed by (FAB hash, imaging task, ...), at most ``max_workers`` alive.

    Parameters
    ----------
    max_workers : int
        Workers kept at once; the least recently used one is stopped beyond it.
    job_timeout : float, optional
        Seconds one job may run before its worker is killed (None: no limit).
    """

    def __init__(self, max_workers: int = 2, job_timeout: float | None = None) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        if job_timeout is not None and not job_timeout > 0:
            raise ValueError(f"job_timeout must be > 0 seconds, got {job_timeout}")
        self.max_workers = max_workers
        self.job_timeout = job_timeout
        self._workers: OrderedDict[Hashable, _Worker] = OrderedDict()
        self.started = 0

    def run(self, key: Hashable, job: dict[str, Any], launch: WorkerLaunch | None = None
            ) -> tuple:
        """Run ``job`` on the worker of ``key`` (started with ``launch`` if needed, default
        :func:`plain_launch`); a crashed or timed-out one is dropped."""
        worker = self._workers.pop(key, None)
        if worker is None:
            while len(self._workers) >= self.max_workers:
                _, oldest = self._workers.popitem(last=False)
                oldest.stop()
            worker = _Worker(key, launch or plain_launch())
            self.started += 1
        outcome = worker.run(job, self.job_timeout)
        if outcome[0] in ("crashed", "timeout"):
            log.error("warm worker %d of %s %s; a new one starts on the next message",
                      worker.process.pid, key, f"exited with code {outcome[1]}"
                      if outcome[0] == "crashed" else f"ran past {outcome[1]:g} s and was killed")
            worker.stop()
        else:
            self._workers[key] = worker
        return outcome

    def retire(self, stale: Callable[[Hashable], bool]) -> int:
        """Stop every worker whose key is ``stale``; how many were stopped."""
        keys = [key for key in self._workers if stale(key)]
        for key in keys:
            self._workers.pop(key).stop()
        return len(keys)

    def discard(self, fab_hash: str) -> None:
        """Stop every worker of the bundle ``fab_hash`` (its code may have changed)."""
        for key in [key for key in self._workers if key[0] == fab_hash]:
            self._workers.pop(key).stop()

    def close(self) -> None:
        """Stop every worker."""
        while self._workers:
            self._workers.popitem()[1].stop()
