"""SuperLink faults in a real deployment on 127.0.0.1 (TLS SuperLink, authenticated
SuperNodes), resumed by the documented command (issue 47, item 4).

The federation is submitted with ``fedmed federate`` (``python -m app.tooling.cli
federate``, what ``make federate`` runs). The SuperLink is killed with SIGKILL (with the
ServerApp it started) in the middle of round 2: once a hospital's SuperNode has pulled its
round-2 train instruction, before round 2 is checkpointed. It is restarted on the same
state database and port; the SuperNodes, left running, reconnect by themselves, and
``fedmed federate --resume`` (``make federate RESUME=1``) continues from the round-1
checkpoint in the same MLflow run: round 2 is run again and logged once, and the run
ends ``finished:completed``.

Every process is started by the test or ``app.tooling`` in its own process group and
stopped (or killed) by PID; every wait is bounded and waits for an event (a log line, a
file). The SuperLink is the ``private_deployment`` fixture's (one of its own).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from app.tooling.flwr_cli import wait_online
from app.tooling.registration import register_site
from strategies.rounds.checkpoint import load_checkpoint
from tests.integration.deployment_helpers import (SITES, crash, only_run, restart_superlink,
                                                  start_node, tail, wait_for)

pytestmark = pytest.mark.integration

#: A SuperNode's log line for each instruction it pulls (Flower 1.42's SuperNode).
TRAIN_PULLED = "Receiving: train message"


class Federate:
    """``fedmed federate [--resume]`` as a hospital's coordinator runs it, in the background."""

    def __init__(self, args: list[str], log_file: Path) -> None:
        self.log_file = log_file
        with open(log_file, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "app.tooling.cli", "federate", *args],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                cwd=Path(__file__).resolve().parents[2])

    def text(self) -> str:
        return self.log_file.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


def test_superlink_killed_mid_round_resumes_by_the_documented_command(
        private_deployment, tmp_path, small_hospitals, mlflow_store):
    d = private_deployment
    data = small_hospitals(tmp_path / "data", 13)
    node_ids = {site: register_site(d.layout, d.flwr_home, site) for site in SITES}
    tracking = mlflow_store(tmp_path)
    checkpoints = tmp_path / "checkpoints"
    command = [
        "--deploy-dir", str(d.layout.root), "--port", str(d.link.port),
        "--flwr-home", str(d.flwr_home), "--tracking-uri", tracking,
        "--artifact-root", str(tmp_path / "art"), "--data-root", str(tmp_path / "data"),
        "--allow-no-roster", "--timeout", "1500",
        *[arg for item in ("num-server-rounds=2", "local-steps=2", "image-size=32",
                           "batch-size=4", "min-nodes=2", "final-evaluation=false",
                           "node-wait-timeout=300", "round-timeout=1200",
                           f"checkpoint-dir={checkpoints}", "experiment=midround")
          for arg in ("-c", item)]]

    def checkpoint_file() -> Path | None:
        found = sorted(checkpoints.glob("*/server-checkpoint.npz"))
        return found[0] if found else None

    nodes = [start_node(d.layout, site, site_dir, d.link.address, tmp_path)
             for site, site_dir in zip(SITES, data)]
    first = resumed = None
    try:
        wait_online(d.flwr_home, node_ids.values(), timeout=300, watch=nodes)
        first = Federate(command, tmp_path / "first.log")
        wait_for(lambda: checkpoint_file() is not None
                 and any(n.log_text().count(TRAIN_PULLED) >= 2 for n in nodes), 1200,
                 "a round-2 train instruction at a site", watch=nodes)
        reconnects = [n.log_text().count("Connection successful") for n in nodes]
        killed = crash(d.link)
        killed_at = time.time()
        assert any("flwr-serverapp" in c for c in killed.values()), killed
        at_kill = load_checkpoint(checkpoint_file(), None)
        assert at_kill.server_round == 1  # in the middle of round 2
        assert first.wait(timeout=300) != 0, first.text()  # its stream broke

        # The SuperNodes kept retrying and reconnect by themselves.
        restart_superlink(d, nodes, reconnects, node_ids.values())

        resumed = Federate([*command, "--resume"], tmp_path / "resumed.log")
        assert resumed.wait(timeout=1560) == 0, resumed.text()[-6000:] + tail(d.link, *nodes)
        output = resumed.text()
        assert "status: finished:completed" in output, output[-6000:]
        assert "Resuming after round 1" in output, output[-6000:]
        assert all(n.process.poll() is None for n in nodes), tail(*nodes)
    finally:
        for background in (first, resumed):
            if background is not None:
                background.stop()
        for node in nodes:
            node.stop()

    client = MlflowClient(tracking_uri=tracking)
    mlflow_run = only_run(client, "midround")  # one MLflow run for the whole federation
    run_id = mlflow_run.info.run_id
    assert mlflow_run.info.status == "FINISHED"
    assert "resumed-after-round-1" in mlflow_run.data.tags
    for key in ("round-seconds", "eval/val-dice", "site/hospital-a/steps",
                "site/hospital-b/steps"):
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert sorted(steps) == [1, 2], (key, steps)  # round 2 once, from the resume
    history = client.get_metric_history(run_id, "round-seconds")
    assert all((m.timestamp < killed_at * 1000) == (m.step == 1) for m in history)
    final = load_checkpoint(checkpoint_file(), None)
    assert final.server_round == 2 and final.mlflow_run_id == run_id
