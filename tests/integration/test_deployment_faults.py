"""Faults in a real deployment on 127.0.0.1 (TLS SuperLink, authenticated SuperNodes).

* A hospital's SuperNode is killed (SIGKILL of it and of every process it
  started: a crash, no clean deactivation) while it holds its round-2
  instruction: the round closes without it (once the SuperLink reports the
  node unavailable, or at the round deadline with a quorum of one), the other
  site's update is applied, MLflow records the site as failed in that round,
  the run completes, and the SuperNode restarted under the same key is used
  again in the next rounds.
* The SuperLink is killed (with the ServerApp process it started) after round 1
  and restarted on the same database and port: the SuperNodes reconnect by
  themselves, ``resume=true`` continues from the server checkpoint in the same
  MLflow run, and the final model is the one trained for all rounds.

Every process is started by ``app.processes`` in its own process group and
stopped (or killed) by PID; every wait is bounded. The SuperLinks come from the
fixtures of ``conftest.py``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlflow
import mlflow.pytorch
import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from app.processes.daemon import DaemonProcess
from app.processes.environment import flower_env, free_port
from app.processes.flwr_cli import CONNECTION, list_supernodes, wait_online
from app.processes.process_tree import descendants, start_time
from app.processes.registration import register_site
from app.processes.run_submission import RunOutcome, submit_run
from app.processes.superlink import SuperLinkProcess
from app.processes.supernode import SuperNodeProcess
from strategies.rounds.checkpoint import load_checkpoint

pytestmark = pytest.mark.integration

SITES = ("hospital-a", "hospital-b")
_STARTED = re.compile(r"Successfully started run (\d+)")


# --- helpers ---------------------------------------------------------------------------


def _tail(*daemons: DaemonProcess) -> str:
    return "\n".join(f"--- {d.name} ---\n{d.log_text()[-3000:]}" for d in daemons)


def _alive(pid: int, started: str | None) -> bool:
    """Whether ``pid`` is still the process that started at ``started`` (zombies are dead)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and fields[19] == started


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _crash(daemon: DaemonProcess, timeout: float = 20.0) -> dict[int, str]:
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
            commands[pid] = _cmdline(pid)
            victims[pid] = started
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
    for pid, started in victims.items():
        if _alive(pid, started):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    daemon.process.wait(timeout=timeout)
    deadline = time.monotonic() + timeout
    while any(_alive(p, s) for p, s in victims.items()) and time.monotonic() < deadline:
        time.sleep(0.2)
    survivors = [commands[p] for p, s in victims.items() if _alive(p, s)]
    assert survivors == [], f"still running after SIGKILL: {survivors}"
    return commands


class _BackgroundRun:
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


def _wait_for(check: Callable[[], bool], timeout: float, what: str,
              run: _BackgroundRun | None = None,
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
                                     + _tail(daemon))
        if time.monotonic() >= deadline:
            raise AssertionError(f"no {what} after {timeout:.0f} s\n"
                                 + (run.output() if run else "") + _tail(*watch))
        time.sleep(interval)


def _node_status(flwr_home: Path, node_id: int) -> str:
    return next((n["status"] for n in list_supernodes(flwr_home)
                 if n["node-id"] == str(node_id)), "unknown")


def _start_node(layout, site: str, site_dir: Path, link_address: str, tmp_path: Path,
                port: int | None = None) -> SuperNodeProcess:
    return SuperNodeProcess.start(layout, site, link_address, site_dir,
                                  state_dir=tmp_path / "state" / site,
                                  port=port or free_port(), torch_threads=1)


def _only_run(client: MlflowClient, experiment: str):
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment}"
    runs = client.search_runs([found.experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return runs[0]


def _history(client: MlflowClient, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


# --- 3. a SuperNode dies during round 2 ------------------------------------------------


def test_killed_supernode_is_recorded_as_failed_and_trains_again_after_restart(
        deployment, tmp_path, small_hospitals, mlflow_store):
    d = deployment
    data = small_hospitals(tmp_path / "data", 11)
    node_ids = {site: register_site(d.layout, d.flwr_home, site) for site in SITES}
    tracking = mlflow_store(tmp_path)  # a migrated empty store (tests/conftest.py)
    # min-nodes=2: round 1 has both sites, and a round waits (bounded) for a site
    # that went offline to come back. round.quorum=1 with round.deadline: a round
    # may close without a site; the deadline is far above a healthy round (a
    # cold first round takes ~50 s on 2 loaded cores here, and took over 90 s
    # on the official CI machine, which then closed round 1 without a live
    # site), so no live site is ever dropped. The crashed site's round closes
    # earlier, when the SuperLink reports the node unavailable (heartbeat
    # expired, <= 60 s after the crash), so the long deadline costs no time.
    run_config = (
        "num-server-rounds=3 local-steps=2 image-size=32 batch-size=4 min-nodes=2 "
        "final-evaluation=false "  # tested in test_simulation; saves CI minutes
        "node-wait-timeout=150 round.deadline=300 round.quorum=1 round-timeout=360 "
        f'tracking-uri="{tracking}" artifact-root="{tmp_path / "art"}" experiment="faults"')
    nodes = {site: _start_node(d.layout, site, site_dir, d.link.address, tmp_path)
             for site, site_dir in zip(SITES, data)}
    started = list(nodes.values())
    run = None
    try:
        wait_online(d.flwr_home, node_ids.values(), timeout=90, watch=started)
        # Run budgets are far above a healthy run: a 3-round run took 420 s on 2 loaded cores.
        run = _BackgroundRun(d.flwr_home, run_config, timeout=720)
        crashed = nodes["hospital-b"]
        # Round 2 has begun and hospital-b has taken its instruction: crash it now.
        _wait_for(lambda: crashed.log_text().count("Receiving: train message") >= 2, 300,
                  "round-2 train message at hospital-b", run=run, watch=started)
        client = MlflowClient(tracking_uri=tracking)
        mlflow_run = _only_run(client, "faults")
        for site in SITES:  # round 1 is in MLflow for both sites
            assert 1 in _history(client, mlflow_run.info.run_id, f"site/{site}/val-dice")
        killed = _crash(crashed)
        assert any("app.processes.site_node" in c for c in killed.values()), killed

        # Its session stays 'online' at the SuperLink until its heartbeat expires
        # (2 x 30 s at most); then it may connect again with the same key. Each
        # poll is a `flwr` process (3 CPU-s on 2 loaded cores): every 5 s.
        _wait_for(lambda: _node_status(d.flwr_home, node_ids["hospital-b"]) == "offline",
                  120, "offline status of hospital-b", run=run, watch=[nodes["hospital-a"]],
                  interval=5.0)
        nodes["hospital-b"] = _start_node(d.layout, "hospital-b", data[1], d.link.address,
                                          tmp_path)
        started.append(nodes["hospital-b"])
        wait_online(d.flwr_home, [node_ids["hospital-b"]], timeout=90,
                    watch=[nodes["hospital-b"]])

        outcome = run.result(timeout=780)
        assert outcome.status == "finished:completed", run.output() + _tail(d.link, *started)
        assert all(n.process.poll() is None for n in nodes.values()), _tail(*nodes.values())
    finally:
        if run is not None:
            run.close()
        for node in started:
            node.stop()
    assert all(node.process.poll() is not None for node in started)

    client = MlflowClient(tracking_uri=tracking)
    mlflow_run = _only_run(client, "faults")
    assert mlflow_run.info.status == "FINISHED"
    assert mlflow_run.data.tags["flwr.run-id"] == str(outcome.run_id)
    run_id = mlflow_run.info.run_id
    rounds = [1, 2, 3]
    assert sorted(_history(client, run_id, "eval/val-dice")) == rounds
    assert _history(client, run_id, "replies-accepted") == {1: 2.0, 2: 1.0, 3: 2.0}
    # hospital-a took part in every round.
    assert _history(client, run_id, "site/hospital-a/failed") == {1: 0.0, 2: 0.0, 3: 0.0}
    for key in ("steps", "train-loss", "val-dice"):
        assert sorted(_history(client, run_id, f"site/hospital-a/{key}")) == rounds, key
    # hospital-b: failed in round 2, the round it crashed in (no update from it);
    # restarted under the same key it evaluates the round-2 model and trains in round 3.
    assert _history(client, run_id, "site/hospital-b/failed") == {1: 0.0, 2: 1.0, 3: 0.0}
    assert sorted(_history(client, run_id, "site/hospital-b/steps")) == [1, 3]
    assert sorted(_history(client, run_id, "site/hospital-b/val-dice")) == rounds
    local = client.download_artifacts(run_id, "rounds/round-002-dropped.json", str(tmp_path))
    dropped = json.loads(Path(local).read_text())
    assert list(dropped) == ["train/hospital-b"], dropped


# --- 4. the SuperLink (and its ServerApp) dies after round 1 -----------------------------


def test_server_killed_after_round_1_resumes_in_the_same_mlflow_run(private_deployment,
                                                                   tmp_path, small_hospitals,
                                                                   mlflow_store):
    d = private_deployment
    data = small_hospitals(tmp_path / "data", 12)
    node_ids = {site: register_site(d.layout, d.flwr_home, site) for site in SITES}
    tracking = mlflow_store(tmp_path)  # a migrated empty store (tests/conftest.py)
    checkpoints = tmp_path / "checkpoints"

    def checkpoint_file() -> Path | None:
        """The federation's checkpoint (one folder per federation, keyed by MLflow run)."""
        found = sorted(checkpoints.glob("*/server-checkpoint.npz"))
        return found[0] if found else None

    run_config = (
        "num-server-rounds=2 local-steps=2 image-size=32 batch-size=4 min-nodes=2 "
        "final-evaluation=false "  # tested in test_simulation; saves CI minutes
        f'node-wait-timeout=150 checkpoint-dir="{checkpoints}" tracking-uri="{tracking}" '
        f'artifact-root="{tmp_path / "art"}" experiment="resume"')
    nodes = [_start_node(d.layout, site, site_dir, d.link.address, tmp_path)
             for site, site_dir in zip(SITES, data)]
    first = resumed = None
    try:
        wait_online(d.flwr_home, node_ids.values(), timeout=90, watch=nodes)
        # The status of this run cannot be read while its SuperLink is down: short wait.
        first = _BackgroundRun(d.flwr_home, run_config, timeout=300, status_timeout=5)
        _wait_for(lambda: checkpoint_file() is not None, 240, "round-1 checkpoint", run=first, watch=nodes)
        reconnects = [n.log_text().count("Connection successful") for n in nodes]
        old = d.link
        killed = _crash(old)
        killed_at = time.time()
        assert any("flwr-serverapp" in c for c in killed.values()), killed
        at_kill = load_checkpoint(checkpoint_file(), None)
        assert at_kill.server_round == 1
        try:
            first.result(timeout=120)  # its stream broke; its status is unreadable
        except Exception:  # noqa: BLE001
            pass
        assert first.done(), first.output()

        d.link = SuperLinkProcess.start_tls(d.layout, host=old.host, port=old.port)
        # The SuperNodes kept retrying and reconnect by themselves.
        assert all(n.process.poll() is None for n in nodes), _tail(*nodes)
        _wait_for(lambda: all(n.log_text().count("Connection successful") > before
                              for n, before in zip(nodes, reconnects)), 120,
                  "SuperNode reconnection", watch=nodes)
        wait_online(d.flwr_home, node_ids.values(), timeout=60, watch=nodes)

        resumed = _BackgroundRun(d.flwr_home, run_config + " resume=true", timeout=600)
        outcome = resumed.result(timeout=660)
        assert outcome.status == "finished:completed", resumed.output() + _tail(d.link, *nodes)
        assert "Resuming after round 1" in resumed.output(last=10**6)
        assert all(n.process.poll() is None for n in nodes), _tail(*nodes)
    finally:
        for background in (first, resumed):
            if background is not None:
                background.close()
        for node in nodes:
            node.stop()
    assert all(node.process.poll() is not None for node in nodes)
    assert outcome.run_id != first.run_id

    client = MlflowClient(tracking_uri=tracking)
    mlflow_run = _only_run(client, "resume")  # one MLflow run for the whole federation
    run_id = mlflow_run.info.run_id
    assert mlflow_run.info.status == "FINISHED"
    assert mlflow_run.data.tags["flwr.run-id"] == str(outcome.run_id)
    assert mlflow_run.data.tags["resumed-after-round-1"] == str(outcome.run_id)
    for key in ("eval/val-dice", "train/train-loss", "site/hospital-a/steps",
                "site/hospital-b/steps"):
        history = client.get_metric_history(run_id, key)
        assert sorted(m.step for m in history) == [1, 2], key
        # Round 1 before the kill, round 2 by the resumed ServerApp.
        assert all((m.timestamp < killed_at * 1000) == (m.step == 1) for m in history), key

    final = load_checkpoint(checkpoint_file(), None)
    assert final.server_round == 2
    assert final.mlflow_run_id == run_id
    # The model in MLflow is the round-2 model, trained on from the round-1 checkpoint.
    models = {m.name: m for m in client.search_logged_models(
        experiment_ids=[mlflow_run.info.experiment_id])}
    assert sorted(models) == ["best-model", "global-model"]
    assert {m.source_run_id for m in models.values()} == {run_id}
    mlflow.set_tracking_uri(tracking)
    state = mlflow.pytorch.load_model(models["global-model"].model_uri).state_dict()
    assert list(state) == final.keys
    for key, array in zip(final.keys, final.arrays):
        np.testing.assert_allclose(state[key].numpy(), array, err_msg=key)
    assert any(not np.array_equal(a, b) for a, b in zip(at_kill.arrays, final.arrays))
