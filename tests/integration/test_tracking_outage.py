"""Fault test: the MLflow server is down mid-run, longer than any request's budget.

A real ``mlflow server`` (sqlite backend, artifact folder in tmp) tracks a real
federation (``python -m app.processes.simulate``, what ``make simulate`` runs:
SuperLink, ``flwr run``, the ServerApp with its http tracking URI) of two small
hospitals over three rounds. Once round 1 has been sent (the outbox on the
server's disk is empty again) the server is killed (SIGKILL of its process
group: no shutdown); it stays down until the
federation has ended round 2 and gone on to round 3 without it (its tracking
requests get no retry and a 5 s budget, :mod:`app.tracking.tracker`), and for
at least ``MIN_DOWNTIME`` seconds; then it is started again on the same port
and sqlite store. Afterwards every round is in MLflow exactly once (every
metric: no gap, no duplicate step), the rounds ended during the outage keep
their own end time, the outbox is empty, the run and the Flower run finished,
and the best and final models were logged. Round 3 may also end while it is down;
logging the models, the calls that need MLflow, then wait for it through MLflow's own
retries (:mod:`app.tracking.federation_models`).

The sites personalise (``personalisation.method = "finetune"``, one adaptation
step before each evaluation, issue 16): the personalised metric and its gain over
the global model reach MLflow for every site and round, exactly once like the rest.

The round durations before, during and after the outage are printed (``-s``)
and, when ``FEDMED_OUTAGE_TIMINGS`` names a file, written there as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from app.processes.daemon import DaemonProcess, spawn_daemon
from app.processes.mlflow_server import MlflowServerProcess
from app.tracking import OUTBOX_FILE
from strategies.rounds.checkpoint import CHECKPOINT_FILE
from tests.integration.conftest import processes_mentioning

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration

ROUNDS = 3
SITES = ("hospital-00", "hospital-01")
EXPERIMENT = "outage"
#: Seconds the server stays down at least (a request's budget is 5 s, no retry).
MIN_DOWNTIME = 15.0
RUN_CONFIG = ("local-steps=2", "image-size=32", "batch-size=4", "min-nodes=2",
              "node-wait-timeout=120", f"experiment={EXPERIMENT}", f"num-server-rounds={ROUNDS}",
              "final-evaluation=false",  # the end-of-federation test: test_simulation
              "personalisation.method=finetune", "personalisation.finetune-steps=1")


def _wait_for(check: Callable[[], bool], timeout: float, what: str, federation: DaemonProcess,
              interval: float = 0.5) -> None:
    """Poll ``check`` (bounded); fail at once if the federation process ended."""
    deadline = time.monotonic() + timeout
    while not check():
        if federation.process.poll() is not None:
            raise AssertionError(f"the federation ended while waiting for {what}:\n"
                                 + federation.log_text()[-6000:])
        if time.monotonic() >= deadline:
            raise AssertionError(f"no {what} after {timeout:.0f} s:\n"
                                 + federation.log_text()[-6000:])
        time.sleep(interval)


def _round_1_sent(checkpoints: Path) -> bool:
    """Round 1 is checkpointed and its record left the (now empty) outbox for MLflow.

    Read from the server's disk, not from MLflow: the kill follows within a poll
    interval, long before round 2 ends.
    """
    outboxes = list(checkpoints.glob(f"*/{OUTBOX_FILE}"))
    return (any(checkpoints.glob(f"*/{CHECKPOINT_FILE}")) and len(outboxes) == 1
            and outboxes[0].read_text() == "")


def _pending_steps(checkpoints: Path) -> list[int]:
    """Steps waiting in the federation's tracking outbox on the server's disk."""
    steps = []
    for outbox in checkpoints.glob(f"*/{OUTBOX_FILE}"):
        for line in outbox.read_text().splitlines():
            try:
                steps.append(json.loads(line)["step"])
            except ValueError:  # a line being written
                continue
    return steps


def _timings(client: MlflowClient, run_id: str, moments: tuple[float, ...]) -> dict:
    """Round durations before, during and after the outage, and the wait at the end.

    ``moments``: federation start, kill, restart begun, server healthy again,
    federation process ended (``time.time()``). A round's end is the timestamp
    of its metrics (the time its record was made, kept when it is sent late).
    """
    started_at, killed_at, restarted_at, back_at, ended_at = moments
    history = client.get_metric_history(run_id, "round-seconds")
    own = {m.step: m.value for m in history}
    ends = {m.step: m.timestamp / 1000 for m in history}
    rounds = []
    for step in sorted(ends):
        phase = ("before" if ends[step] < killed_at else
                 "during" if ends[step] < back_at else "after")
        between = ends[step] - ends[step - 1] if step - 1 in ends else None
        rounds.append({"round": step, "phase": phase, "round_seconds": round(own[step], 2),
                       "seconds_since_previous_round_end":
                           None if between is None else round(between, 2)})
    return {"rounds": rounds, "mlflow_down_seconds": round(back_at - killed_at, 2),
            "mlflow_restart_startup_seconds": round(back_at - restarted_at, 2),
            "last_round_end_to_federation_exit_seconds": round(ended_at - max(ends.values()), 2),
            "federation_wall_seconds": round(ended_at - started_at, 2)}


def _check_every_round_once(client: MlflowClient, killed_at: float, back_at: float) -> str:
    """The one run finished with every round exactly once; returns its id."""
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    run = runs[0]
    run_id = run.info.run_id
    assert run.info.status == "FINISHED"
    rounds = list(range(1, ROUNDS + 1))
    # Every round metric of the run: each step at most once, none outside the run's rounds
    # (best-round and best-<metric> are the federation's, logged once at the end).
    for key in (k for k in run.data.metrics if not k.startswith("best-")):
        steps = sorted(m.step for m in client.get_metric_history(run_id, key))
        assert len(steps) == len(set(steps)) and set(steps) <= set(rounds), (key, steps)
    for key in ("round-seconds", "eval/val-dice", "train/train-loss", "replies-accepted",
                "eval/personalised-val-dice", "eval/personalised-gain-val-dice",
                *(f"site/{site}/{name}" for site in SITES
                  for name in ("val-dice", "steps", "personalised-val-dice",
                               "personalised-gain-val-dice"))):
        assert sorted(m.step for m in client.get_metric_history(run_id, key)) == rounds, key
    # Round 1 went out before the kill; round 2 ended while MLflow was down and was
    # sent later with its own end time.
    history = client.get_metric_history(run_id, "round-seconds")
    ends = {m.step: m.timestamp / 1000 for m in history}
    assert ends[1] < killed_at < ends[2] < back_at, (killed_at, ends, back_at)
    models = client.search_logged_models(experiment_ids=[experiment.experiment_id])
    assert sorted(m.name for m in models) == ["best-model", "global-model"]
    assert {m.source_run_id for m in models} == {run_id}
    return run_id


def test_mlflow_server_down_mid_run_loses_no_round_and_stalls_no_round(tmp_path,
                                                                        small_hospitals,
                                                                        mlflow_store):
    small_hospitals(tmp_path / "data", 5)
    checkpoints = tmp_path / "checkpoints"
    server = MlflowServerProcess.start(mlflow_store(tmp_path),  # migrated: a faster start
                                       tmp_path / "mlflow-artifacts", tmp_path / "mlflow.log",
                                       startup_timeout=180)
    client = MlflowClient(tracking_uri=server.uri)
    command = [sys.executable, "-m", "app.processes.simulate",
               "--data-root", str(tmp_path / "data"), "--sites", str(len(SITES)),
               "--tracking-uri", server.uri, "--artifact-root", str(tmp_path / "artifacts"),
               "--flwr-home", str(tmp_path / "flwr-home"), "--log-dir", str(tmp_path / "logs"),
               "--timeout", "540"]
    for item in (*RUN_CONFIG, f"checkpoint-dir={checkpoints}"):
        command += ["-c", item]
    started_at = time.time()
    federation = spawn_daemon(command, {**os.environ, "PYTHONPATH": str(ROOT)},
                              tmp_path / "federation.log", "simulate", cwd=ROOT)
    try:
        _wait_for(lambda: _round_1_sent(checkpoints), 420, "round 1 sent to MLflow",
                  federation, interval=0.1)
        killed_at = time.time()
        server.kill()
        # Round 2 ends without MLflow (its record waits on disk) and round 3 begins.
        _wait_for(lambda: 2 in _pending_steps(checkpoints)
                  and f"[ROUND 3/{ROUNDS}]" in federation.log_text(), 300,
                  "round 3 after round 2 ended with MLflow down", federation)
        time.sleep(max(0.0, killed_at + MIN_DOWNTIME - time.time()))
        restarted_at = time.time()
        server = server.restart(startup_timeout=180)
        back_at = time.time()
        assert federation.process.wait(timeout=540) == 0, federation.log_text()[-6000:]
        ended_at = time.time()
        output = federation.log_text()
        assert "status: finished:completed" in output
        assert "not reachable" in output  # the round-2 flush failed and was not retried
        run_id = _check_every_round_once(client, killed_at, back_at)
        assert _pending_steps(checkpoints) == []
        timings = _timings(client, run_id, (started_at, killed_at, restarted_at, back_at,
                                            ended_at))
    finally:
        federation.stop()
        server.stop()
    print("\nMLflow outage timings:\n" + json.dumps(timings, indent=2))
    target = os.environ.get("FEDMED_OUTAGE_TIMINGS")
    if target:
        Path(target).write_text(json.dumps(timings, indent=2) + "\n")
    assert server.process.poll() is not None and federation.process.poll() is not None
    deadline = time.monotonic() + 20
    while processes_mentioning(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_mentioning(str(tmp_path)) == []
