"""Ray clusters for ``make simulate RAY_ADDRESS=host:port``: the address check and a local cluster.

Flower's simulation engine (``flwr-simulation``, started by the simulation
SuperLink) builds its :class:`RayBackend`, which calls ``ray.init()`` with no
address and only the federation config's ``init-args`` (``num-cpus``,
``num-gpus``, ``logging-level``, ``log-to-driver``; Flower 1.41
``flwr/server/superlink/fleet/vce/backend/raybackend.py``). Ray then takes the
``RAY_ADDRESS`` environment variable (``ray/_private/worker.py``, ``init``) and
attaches to that cluster instead of starting its own, so the address reaches
the engine through the SuperLink's environment, which its ``flwr-simulation``
process inherits. The init args must not set ``num-cpus``/``num-gpus`` then
(Ray refuses them when it attaches); ``make simulate`` never does.

:func:`require_reachable` is the check ``make simulate`` runs before it starts
anything. :class:`LocalRayCluster` starts a head and worker nodes on loopback
with a private ``--temp-dir`` (the real-process test); it is stopped by PID,
never with ``ray stop``, which stops every Ray process of the user.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from app.processes.environment import flower_env, free_port
from app.processes.errors import FlowerProcessError
from app.processes.process_tree import descendants, start_time, stop_pids

__all__ = ["require_reachable", "LocalRayCluster"]

_RAY = str(Path(sys.executable).parent / "ray")
_STATE_SCRIPT = """
import json, ray
ray.init(logging_level="ERROR", log_to_driver=False)
nodes = [n for n in ray.nodes() if n["Alive"]]
jobs = [j["Entrypoint"] for j in ray._private.state.jobs()]
print(json.dumps({"nodes": len(nodes), "jobs": jobs}))
"""


def require_reachable(address: str, timeout: float = 5.0) -> str:
    """Check that ``host:port`` (a Ray head's GCS port) accepts TCP connections.

    Returns the address unchanged; raises :class:`FlowerProcessError` naming
    ``RAY_ADDRESS`` when it is malformed or nothing answers there.
    """
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise FlowerProcessError(f"RAY_ADDRESS={address!r}: expected host:port of a Ray head "
                                 "(the --port of `ray start --head`, 6379 by default)")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise FlowerProcessError(
            f"RAY_ADDRESS={address}: no Ray cluster can be reached there ({exc}); start one "
            f"with `ray start --head --port {port}` on {host}, or leave RAY_ADDRESS unset "
            "to run on a Ray started for this simulation") from exc
    return address


@dataclass
class LocalRayCluster:
    """A Ray head and worker nodes on 127.0.0.1 that we started, under ``temp_dir``."""

    temp_dir: Path
    port: int
    log_file: Path
    pids: list[tuple[int, str]] = field(default_factory=list)

    @property
    def address(self) -> str:
        """``127.0.0.1:port`` of the head (the value of ``RAY_ADDRESS``)."""
        return f"127.0.0.1:{self.port}"

    @classmethod
    def start(cls, temp_dir: Path, head_cpus: int = 1, worker_cpus: tuple[int, ...] = (1,),
              timeout: float = 120.0, attempts: int = 2) -> LocalRayCluster:
        """``ray start --head`` plus one ``ray start --address`` per worker node.

        ``temp_dir`` must be short (Ray's unix sockets live under it, 107 bytes at most).
        A node whose raylet does not register within Ray's fixed 30 s (a loaded
        machine) fails ``ray start``: the cluster is stopped and started again, up
        to ``attempts`` times in all.
        """
        for attempt in range(1, attempts + 1):
            try:
                return cls._start_once(temp_dir, head_cpus, worker_cpus, timeout)
            except FlowerProcessError:
                if attempt == attempts:
                    raise
        raise FlowerProcessError(f"LocalRayCluster.start: attempts must be >= 1, got {attempts}")

    @classmethod
    def _start_once(cls, temp_dir: Path, head_cpus: int, worker_cpus: tuple[int, ...],
                    timeout: float) -> LocalRayCluster:
        temp_dir.mkdir(parents=True, exist_ok=True)
        cluster = cls(temp_dir=temp_dir, port=free_port(), log_file=temp_dir / "ray-start.log")
        common = ["--node-ip-address", "127.0.0.1", "--temp-dir", str(temp_dir),
                  "--disable-usage-stats"]
        commands = [[_RAY, "start", "--head", "--port", str(cluster.port), "--num-cpus",
                     str(head_cpus), "--include-dashboard", "false",
                     "--dashboard-port", str(free_port()),
                     "--ray-client-server-port", str(free_port()), *common]]
        commands += [[_RAY, "start", "--address", cluster.address, "--num-cpus", str(cpus),
                      *common] for cpus in worker_cpus]
        try:
            for command in commands:
                cluster._run(command, timeout)
        except FlowerProcessError:
            cluster.stop()
            raise
        return cluster

    def _run(self, command: list[str], timeout: float) -> None:
        env = flower_env(self.temp_dir)
        env.pop("RAY_ADDRESS", None)  # `ray start --head` must not join another cluster
        with open(self.log_file, "ab") as log:
            try:
                result = subprocess.run(command, env=env, stdout=log,
                                        stderr=subprocess.STDOUT, timeout=timeout, check=False)
            except subprocess.TimeoutExpired as exc:
                raise FlowerProcessError(f"`{' '.join(command[1:4])}` took over {timeout:.0f} s; "
                                         f"see {self.log_file}") from exc
        self.pids = self.processes()
        if result.returncode != 0:
            raise FlowerProcessError(f"`{' '.join(command[1:4])}` exited with "
                                     f"{result.returncode}; see {self.log_file}")

    def processes(self) -> list[tuple[int, str]]:
        """Ray daemons (programs of the ``ray`` package) whose command line names
        ``temp_dir``, the head's Ray client server (``--address=<ip>:<port>``), and
        their descendants."""
        spec = importlib.util.find_spec("ray")
        assert spec is not None and spec.origin is not None, "LocalRayCluster needs ray"
        marker, package = str(self.temp_dir).encode(), str(Path(spec.origin).parent).encode()
        client, gcs_port = b"ray.util.client.server", f":{self.port}\0".encode()
        found = {pid: started for pid, started in self.pids if start_time(pid) == started}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            started = start_time(int(entry.name))
            ours = ((marker in cmdline and package in cmdline)
                    or (client in cmdline and gcs_port in cmdline))
            if ours and started is not None:
                found[int(entry.name)] = started
        for pid in list(found):
            found.update(dict(descendants(pid)))
        return sorted(found.items())

    def state(self) -> dict:
        """``{"nodes": alive node count, "jobs": [driver entrypoints]}`` from the head's GCS."""
        env = flower_env(self.temp_dir, {"RAY_ADDRESS": self.address})
        result = subprocess.run([sys.executable, "-c", _STATE_SCRIPT], env=env,
                                capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            raise FlowerProcessError(f"reading the state of the Ray cluster at {self.address} "
                                     f"failed: {result.stderr[-2000:]}")
        return json.loads(result.stdout.strip().splitlines()[-1])

    def stop(self, timeout: float = 3.0) -> None:
        """SIGTERM (then SIGKILL) every process of this cluster, by PID."""
        self.pids = self.processes()
        stop_pids(self.pids, timeout=timeout)
