"""The coordinator's faults in a real deployment on 127.0.0.1 (TLS SuperLink, authenticated
SuperNodes), each resumed by the documented command (issue 47, item 4 a, c, d).

One federation of three rounds, submitted with ``fedmed federate`` (``python -m
app.tooling.cli federate``, what ``make federate`` runs), meets two faults:

1. **The SuperLink dies in the middle of round 2.** SIGKILL (with the ServerApp it
   started) once a hospital's SuperNode has pulled its round-2 train instruction, before
   round 2 is checkpointed. It is restarted on the same state database and port; the
   SuperNodes, left running, reconnect by themselves, and ``fedmed federate --resume``
   continues from the round-1 checkpoint in the same MLflow run.
2. **The coordinator's machine reboots once round 2 is checkpointed, and its certificate is
   rotated.**
   Every coordinator process at once (SIGSTOP, then SIGKILL: ``fedmed federate``, the
   SuperLink and its ServerApp; the tracking store is a file, as the default). Before the
   documented restart the SuperLink's TLS certificate is re-issued under the same CA
   (``fedmed certs --force``); then ``fedmed superlink`` and ``fedmed federate --resume``.
   The hospitals, never restarted and never told, trust the new certificate through
   their ``ca.crt`` and reconnect; the SuperLink serves the new certificate.

Each round is logged once, in one MLflow run, in the order of the faults (round 1 before
the first, round 2 between them, round 3 after the reboot); the run ends
``finished:completed``; and the model logged in MLflow is the round-3 checkpoint's.

Every process is started by the test or ``app.tooling`` in its own process group and
stopped (or killed) by PID; every wait is bounded and waits for an event (a log line, a
file). The SuperLink is the ``private_deployment`` fixture's (one of its own).
"""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from app.model_source import load_logged_model
from app.tooling.certs import cert_paths
from app.tooling.daemon import DaemonProcess, spawn_daemon
from app.tooling.flwr_cli import wait_online
from app.tooling.registration import register_site
from strategies.rounds.checkpoint import load_checkpoint
from tests.integration.deployment_helpers import (SITES, crash, only_run, restart_superlink,
                                                  start_node, tail, wait_for,
                                                  wait_reconnected)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: A SuperNode's log line for each instruction it pulls (Flower 1.42's SuperNode).
TRAIN_PULLED = "Receiving: train message"
#: ``fedmed superlink``'s banner once its SuperLink answers.
SUPERLINK_UP = "SuperLink on https://"


def fedmed(args: list[str], log_file: Path, name: str) -> DaemonProcess:
    """``fedmed ARGS`` as the coordinator runs it, in the background."""
    return spawn_daemon([sys.executable, "-m", "app.tooling.cli", *args], dict(os.environ),
                        log_file, name, cwd=ROOT)


def served_certificate(port: int) -> str:
    """The PEM certificate the SuperLink on ``port`` presents."""
    return ssl.get_server_certificate(("127.0.0.1", port))


def same_pem(first: str, second: str) -> bool:
    return ssl.PEM_cert_to_DER_cert(first) == ssl.PEM_cert_to_DER_cert(second)


def test_superlink_crash_then_coordinator_reboot_resume_by_the_documented_command(
        private_deployment, tmp_path, small_hospitals, mlflow_store):
    d = private_deployment
    data = small_hospitals(tmp_path / "data", 13)
    node_ids = {site: register_site(d.layout, d.flwr_home, site) for site in SITES}
    tracking = mlflow_store(tmp_path)
    checkpoints = tmp_path / "checkpoints"
    port = d.link.port
    command = [
        "federate", "--deploy-dir", str(d.layout.root), "--port", str(port),
        "--flwr-home", str(d.flwr_home), "--tracking-uri", tracking,
        "--artifact-root", str(tmp_path / "art"), "--data-root", str(tmp_path / "data"),
        "--allow-no-roster", "--timeout", "1500",
        *[arg for item in ("num-server-rounds=3", "local-steps=2", "image-size=32",
                           "batch-size=4", "min-nodes=2", "final-evaluation=false",
                           "node-wait-timeout=300", "round-timeout=1200",
                           f"checkpoint-dir={checkpoints}", "experiment=midround")
          for arg in ("-c", item)]]

    def checkpoint_round() -> int:
        found = sorted(checkpoints.glob("*/server-checkpoint.npz"))
        return load_checkpoint(found[0], None).server_round if found else 0

    def pulled() -> list[int]:
        return [n.log_text().count(TRAIN_PULLED) for n in nodes]

    def reconnections() -> list[int]:
        return [n.log_text().count("Connection successful") for n in nodes]

    nodes = [start_node(d.layout, site, site_dir, d.link.address, tmp_path)
             for site, site_dir in zip(SITES, data)]
    runs: list[DaemonProcess] = []
    try:
        wait_online(d.flwr_home, node_ids.values(), timeout=300, watch=nodes)
        runs.append(fedmed(command, tmp_path / "first.log", "fedmed federate"))

        # 1. The SuperLink alone, in the middle of round 2.
        wait_for(lambda: checkpoint_round() == 1 and max(pulled()) >= 2, 1200,
                 "a round-2 train instruction at a site", watch=nodes)
        reconnects = reconnections()
        killed = crash(d.link)
        killed_at = time.time()
        assert any("flwr-serverapp" in c for c in killed.values()), killed
        assert checkpoint_round() == 1  # in the middle of round 2
        assert runs[-1].process.wait(timeout=300) != 0, runs[-1].log_text()  # stream broke
        restart_superlink(d, nodes, reconnects, node_ids.values())
        runs.append(fedmed([*command, "--resume"], tmp_path / "resumed.log",
                           "fedmed federate --resume"))

        # 2. The coordinator's machine, once round 2 is checkpointed: in round 3. (Not
        # counted by the sites' pulls: after the restart a site may also pull the lost
        # run's round-2 instruction, which the SuperLink kept.)
        wait_for(lambda: checkpoint_round() == 2, 1200, "the round-2 checkpoint",
                 watch=[*nodes, runs[-1]], interval=0.2)
        reconnects = reconnections()
        os.killpg(runs[-1].pid, signal.SIGSTOP)
        killed = crash(d.link)
        os.killpg(runs[-1].pid, signal.SIGKILL)
        runs[-1].process.wait(timeout=30)
        rebooted_at = time.time()
        assert any("flwr-serverapp" in c for c in killed.values()), killed
        assert checkpoint_round() == 2

        # The documented restart, with the SuperLink's certificate rotated first.
        paths = cert_paths(d.layout.certs)
        old_ca, old_cert = paths.ca_cert.read_bytes(), paths.server_cert.read_text()
        rotated = subprocess.run(
            [sys.executable, "-m", "app.tooling.cli", "certs", "--out", str(d.layout.certs),
             "--hosts", "localhost,127.0.0.1", "--force"],
            capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
        assert rotated.returncode == 0, rotated.stdout + rotated.stderr
        new_cert = paths.server_cert.read_text()
        assert not same_pem(new_cert, old_cert)
        assert paths.ca_cert.read_bytes() == old_ca  # the hospitals' ca.crt still holds
        d.link = fedmed(["superlink", "--deploy-dir", str(d.layout.root), "--port", str(port),
                         "--flwr-home", str(d.flwr_home)], tmp_path / "superlink.log",
                        "fedmed superlink")
        wait_for(lambda: SUPERLINK_UP in d.link.log_text(), 300, "the SuperLink's banner",
                 watch=[d.link])
        assert same_pem(served_certificate(port), new_cert)
        wait_reconnected(d.flwr_home, nodes, reconnects, node_ids.values())
        runs.append(fedmed([*command, "--resume"], tmp_path / "rebooted.log",
                           "fedmed federate --resume (after the reboot)"))
        assert runs[-1].process.wait(timeout=1560) == 0, (runs[-1].log_text()[-6000:]
                                                          + tail(d.link, *nodes))
        output = runs[-1].log_text()
        assert "status: finished:completed" in output, output[-6000:]
        assert "Resuming after round 2" in output, output[-6000:]
        assert "Resuming after round 1" in runs[1].log_text()
        assert all(n.process.poll() is None for n in nodes), tail(*nodes)
    finally:
        for process in (*runs, *nodes):
            process.stop()

    client = MlflowClient(tracking_uri=tracking)
    mlflow_run = only_run(client, "midround")  # one MLflow run for the whole federation
    run_id = mlflow_run.info.run_id
    assert mlflow_run.info.status == "FINISHED"
    assert {"resumed-after-round-1", "resumed-after-round-2"} <= set(mlflow_run.data.tags)
    for key in ("round-seconds", "eval/val-dice", "site/hospital-a/steps",
                "site/hospital-b/steps"):
        history = client.get_metric_history(run_id, key)
        assert sorted(m.step for m in history) == [1, 2, 3], key  # each round once
        for m in history:  # round 1 before the crash, 2 between, 3 after the reboot
            assert [m.timestamp > killed_at * 1000, m.timestamp > rebooted_at * 1000] == [
                m.step > 1, m.step > 2], (key, m.step)

    final = load_checkpoint(next(checkpoints.glob("*/server-checkpoint.npz")), None)
    assert final.server_round == 3 and final.mlflow_run_id == run_id
    models = {m.name: m for m in client.search_logged_models(
        experiment_ids=[mlflow_run.info.experiment_id])}
    assert sorted(models) == ["best-model", "global-model"]
    assert {m.source_run_id for m in models.values()} == {run_id}
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracking)
    try:
        state = load_logged_model(models["global-model"].model_uri).model.state_dict()
    finally:
        mlflow.set_tracking_uri(previous)
    assert list(state) == final.keys
    for key, array in zip(final.keys, final.arrays):
        np.testing.assert_allclose(state[key].numpy(), array, err_msg=key)
