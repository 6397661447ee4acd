"""Submit this app with ``flwr run --stream`` and wait (bounded) for its final status.

Used by ``make simulate`` (simulation SuperLink, ``--federation-config`` for the
virtual SuperNodes) and ``make federate`` / the deployment tests (TLS SuperLink).
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.config.product_paths import PROJECT_ROOT
from app.site_runtime.app_bundle import staged_project
from app.tooling.environment import flower_env
from app.tooling.flwr_cli import CONNECTION, flwr, run_status
from app.tooling.process_tree import stop_process_group

__all__ = ["PROJECT_ROOT", "RunOutcome", "submit_run"]

_RUN_ID = re.compile(r"Successfully started run (\d+)")


@dataclass(frozen=True)
class RunOutcome:
    """What ``flwr run`` started and how it ended."""

    run_id: int | None
    status: str


def submit_run(flwr_home: Path, run_config: str, timeout: float,
               connection: str = CONNECTION, project: Path = PROJECT_ROOT,
               on_line: Callable[[str], None] | None = None,
               env_extra: dict[str, str] | None = None,
               status_timeout: float = 60.0,
               federation_config: str | None = None) -> RunOutcome:
    """``flwr run <project> <connection> --stream``; wait (bounded) for the final status.

    Parameters
    ----------
    flwr_home : Path
        ``FLWR_HOME`` whose ``config.toml`` names ``connection``.
    run_config : str
        The ``--run-config`` string (see :mod:`app.tooling.run_config_string`).
    timeout : float
        Seconds the run may stream; a run still going then is stopped with ``flwr stop``.
    on_line : callable, optional
        Called with every line ``flwr run`` prints (the ServerApp's progress).
    env_extra : dict, optional
        Extra environment for ``flwr run`` (and, in simulation, the app it starts).
    status_timeout : float
        Seconds to wait for the SuperLink to record the final status.
    federation_config : str, optional
        ``--federation-config`` value (simulation: ``num-supernodes=N ...``).

    Returns
    -------
    RunOutcome
        The run id (None if no run started) and its status from
        ``flwr ls --run-id ID --format json``: ``flwr run`` exits 0 even when
        the run failed, so its exit code is not the check.
    """
    # ``flwr run`` bundles the folder it is given; the staged copy holds only the
    # bundle's files, so Flower does not walk the checkout's virtual environment.
    project = staged_project(project, Path(flwr_home) / "staged-apps")
    command = ["flwr", "run", str(project), connection, "--stream", "--run-config", run_config]
    if federation_config is not None:
        command += ["--federation-config", federation_config]
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
        flwr(flwr_home, ["stop", str(run_id), connection])
    # The stream can end a moment before the SuperLink records the final status.
    deadline = time.monotonic() + status_timeout
    status = run_status(flwr_home, connection, run_id)
    while not status.startswith("finished") and time.monotonic() < deadline:
        time.sleep(1.0)
        status = run_status(flwr_home, connection, run_id)
    return RunOutcome(run_id, status)
