"""The environment of every Flower daemon and ``flwr`` CLI call of this project.

A project-local ``FLWR_HOME``, no runtime dependency installation (a SuperLink
would otherwise ``uv sync`` the app and pull a CUDA torch), no telemetry, no
update check, and this interpreter's ``bin`` folder first on ``PATH``.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

__all__ = ["flower_env", "free_port"]


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
        # Ray's start on a loaded machine (app/tooling/local_ray.py): a raylet
        # aborts when its dashboard agent has not written its port within
        # agent_register_timeout_ms (crashed at 17 s under load 14); a worker
        # (a virtual site importing the ClientApp) is killed if it registers
        # later than worker_register_timeout_seconds (default 60).
        "RAY_agent_register_timeout_ms": "240000",
        "RAY_worker_register_timeout_seconds": "300",
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
