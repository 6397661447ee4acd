"""Helpers of the real-deployment fault tests: crash a daemon, run a federation in the
background, bounded waits, a site's SuperNode, the one MLflow run of an experiment."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mlflow.tracking import MlflowClient

from app.tooling.daemon import DaemonProcess
from app.tooling.environment import flower_env, free_port
from app.tooling.flwr_cli import CONNECTION, list_supernodes, wait_online
from app.tooling.process_tree import descendants, start_time
from app.tooling.run_submission import RunOutcome, submit_run
from app.site_runtime.supernode import SuperNodeProcess
from app.tooling.superlink import SuperLinkProcess

SITES = ("hospital-a", "hospital-b")
#: The development policy (any app bundle, every request): the site runner needs a policy file.
PERMISSIVE_POLICY = Path(__file__).resolve().parents[2] / "configs" / "site-policy-permissive.toml"
_STARTED = re.compile(r"Successfully started run (\d+)")


def tail(*daemons: DaemonProcess) -> str:
    return "\n".join(f"--- {d.name} ---\n{d.log_text()[-3000:]}" for d in daemons)


def alive(pid: int, started: str | None) -> bool:
    """Whether ``pid`` is still the process that started at ``started`` (zombies are dead)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and fields[19] == started


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def crash(daemon: DaemonProcess, timeout: float = 20.0) -> dict[int, str]:
    """SIGKILL a daemon and every process it started, like a machine crash.

    The tree is frozen first (SIGSTOP, repeated until no new descendant
    appears) so nothing can fork while it is killed. Returns ``{pid: command
    line}`` of the killed processes; asserts that all of them are gone.
    """
    victims: dict[int, str | None] = {}
    commands: dict[int, str] = {}
    while True:
        tree = [(daemon.pid, start_time(daemon.pid)), *descendants(daemon.pid)]
        new = [(pid, started) for pid, started in tree
               if pid not in victims and started is not None]
        if not new:
            break
        for pid, started in new:
            commands[pid] = cmdline(pid)
            victims[pid] = started
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
    for pid, started in victims.items():
        if alive(pid, started):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    daemon.process.wait(timeout=timeout)
    deadline = time.monotonic() + timeout
    while any(alive(p, s) for p, s in victims.items()) and time.monotonic() < deadline:
        time.sleep(0.2)
    survivors = [commands[p] for p, s in victims.items() if alive(p, s)]
    assert survivors == [], f"still running after SIGKILL: {survivors}"
    return commands


class BackgroundRun:
    """:func:`submit_run` in a thread, so the test can act while the federation runs."""

    def __init__(self, flwr_home: Path, run_config: str, timeout: float,
                 status_timeout: float = 60.0) -> None:
        self.lines: list[str] = []  # the `flwr run --stream` output, seconds since submit
        self._flwr_home = flwr_home
        self._started = time.monotonic()
        self._pool = ThreadPoolExecutor(max_workers=1)
        self._future = self._pool.submit(submit_run, flwr_home, run_config, timeout,
                                          on_line=self._add, status_timeout=status_timeout)

    def _add(self, line: str) -> None:
        self.lines.append(f"{time.monotonic() - self._started:6.1f}s {line}")

    @property
    def run_id(self) -> int | None:
        match = _STARTED.search("".join(self.lines))
        return int(match.group(1)) if match else None

    def done(self) -> bool:
        return self._future.done()

    def output(self, last: int = 4000) -> str:
        return "".join(self.lines)[-last:]

    def result(self, timeout: float) -> RunOutcome:
        return self._future.result(timeout=timeout)

    def close(self, timeout: float = 90.0) -> None:
        """Stop the run if it is still going and wait (bounded) for the thread."""
        if not self._future.done() and self.run_id is not None:
            subprocess.run(["flwr", "stop", str(self.run_id), CONNECTION],
                           env=flower_env(self._flwr_home), capture_output=True,
                           timeout=60, check=False)
        try:
            self._future.result(timeout=timeout)
        except Exception:  # noqa: BLE001 - only waiting for the thread to end here
            pass
        self._pool.shutdown(wait=False)


def interrupt_group(process: subprocess.Popen, timeout: float = 60.0) -> None:
    """Ctrl-C in a terminal: SIGINT to ``process``'s group, bounded; then SIGKILL."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def wait_for(check: Callable[[], bool], timeout: float, what: str,
              run: BackgroundRun | None = None,
              watch: Iterable[DaemonProcess] = (), interval: float = 0.5) -> None:
    """Poll ``check`` (bounded); fail early if the run ended or a daemon exited."""
    watch = list(watch)
    deadline = time.monotonic() + timeout
    while not check():
        if run is not None and run.done():
            raise AssertionError(f"the run ended while waiting for {what}:\n{run.output()}")
        for daemon in watch:
            if daemon.process.poll() is not None:
                raise AssertionError(f"{daemon.name} exited while waiting for {what}:\n"
                                     + tail(daemon))
        if time.monotonic() >= deadline:
            raise AssertionError(f"no {what} after {timeout:.0f} s\n"
                                 + (run.output() if run else "") + tail(*watch))
        time.sleep(interval)


def node_status(flwr_home: Path, node_id: int) -> str:
    return next((n["status"] for n in list_supernodes(flwr_home)
                 if n["node-id"] == str(node_id)), "unknown")


def start_node(layout, site: str, site_dir: Path, link_address: str, tmp_path: Path,
                port: int | None = None) -> SuperNodeProcess:
    return SuperNodeProcess.start(layout, site, link_address, site_dir,
                                  state_dir=tmp_path / "state" / site,
                                  port=port or free_port(), torch_threads=1,
                                  policy=PERMISSIVE_POLICY)


def only_run(client: MlflowClient, experiment: str):
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment}"
    runs = client.search_runs([found.experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


def history(client: MlflowClient, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def restart_superlink(deployment, nodes: list[SuperNodeProcess], reconnects: list[int],
                      node_ids: Iterable[int]) -> None:
    """Start the (crashed) SuperLink of ``deployment`` again on its database and port, then
    :func:`wait_reconnected`."""
    old = deployment.link
    deployment.link = SuperLinkProcess.start_tls(deployment.layout, host=old.host,
                                                 port=old.port, startup_timeout=300)
    wait_reconnected(deployment.flwr_home, nodes, reconnects, node_ids)


def wait_reconnected(flwr_home: Path, nodes: list[SuperNodeProcess], reconnects: list[int],
                     node_ids: Iterable[int]) -> None:
    """Wait for the running ``nodes`` to reconnect by themselves to a restarted SuperLink
    (each log's "Connection successful" count past ``reconnects``) and be listed online."""
    assert all(n.process.poll() is None for n in nodes), tail(*nodes)
    wait_for(lambda: all(n.log_text().count("Connection successful") > before
                         for n, before in zip(nodes, reconnects)), 300,
             "SuperNode reconnection", watch=nodes)
    wait_online(flwr_home, node_ids, timeout=300, watch=nodes)
