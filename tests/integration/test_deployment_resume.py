"""Fault in a real deployment on 127.0.0.1 (TLS SuperLink, authenticated SuperNodes):
the SuperLink dies after round 1 and the federation resumes.

The SuperLink is killed (with the ServerApp process it started) after round 1
and restarted on the same database and port: the SuperNodes reconnect by
themselves, ``resume=true`` continues from the server checkpoint in the same
MLflow run, and the final model is the one trained for all rounds.

Every process is started by ``app.tooling`` in its own process group and
stopped (or killed) by PID; every wait is bounded. The SuperLink comes from the
``private_deployment`` fixture of ``conftest.py`` (a SuperLink of its own), so
this file runs on the other test worker than the shared-SuperLink files
(``tests/conftest.py``).
"""

from __future__ import annotations

import time
from pathlib import Path

import mlflow
import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from app.model_source import load_logged_model
from app.tooling.flwr_cli import wait_online
from app.tooling.registration import register_site
from strategies.rounds.checkpoint import load_checkpoint
from tests.integration.deployment_helpers import (SITES, BackgroundRun, crash, only_run,
                                                  restart_superlink, start_node, tail, wait_for)

pytestmark = pytest.mark.integration


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
        f'node-wait-timeout=300 round-timeout=1200 checkpoint-dir="{checkpoints}" '
        f'tracking-uri="{tracking}" '
        f'artifact-root="{tmp_path / "art"}" experiment="resume"')
    nodes = [start_node(d.layout, site, site_dir, d.link.address, tmp_path)
             for site, site_dir in zip(SITES, data)]
    first = resumed = None
    try:
        wait_online(d.flwr_home, node_ids.values(), timeout=300, watch=nodes)
        # The status of this run cannot be read while its SuperLink is down: short wait.
        first = BackgroundRun(d.flwr_home, run_config, timeout=1500, status_timeout=5)
        wait_for(lambda: checkpoint_file() is not None, 1200, "round-1 checkpoint", run=first,
                  watch=nodes)
        reconnects = [n.log_text().count("Connection successful") for n in nodes]
        killed = crash(d.link)
        killed_at = time.time()
        assert any("flwr-serverapp" in c for c in killed.values()), killed
        at_kill = load_checkpoint(checkpoint_file(), None)
        assert at_kill.server_round == 1
        try:
            first.result(timeout=300)  # its stream broke; its status is unreadable
        except Exception:  # noqa: BLE001
            pass
        assert first.done(), first.output()

        # The SuperNodes kept retrying and reconnect by themselves.
        restart_superlink(d, nodes, reconnects, node_ids.values())

        resumed = BackgroundRun(d.flwr_home, run_config + " resume=true", timeout=1500)
        outcome = resumed.result(timeout=1560)
        assert outcome.status == "finished:completed", resumed.output() + tail(d.link, *nodes)
        assert "Resuming after round 1" in resumed.output(last=10**6)
        assert all(n.process.poll() is None for n in nodes), tail(*nodes)
    finally:
        for background in (first, resumed):
            if background is not None:
                background.close()
        for node in nodes:
            node.stop()
    assert all(node.process.poll() is not None for node in nodes)
    assert outcome.run_id != first.run_id

    client = MlflowClient(tracking_uri=tracking)
    mlflow_run = only_run(client, "resume")  # one MLflow run for the whole federation
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
    state = load_logged_model(models["global-model"].model_uri).model.state_dict()
    assert list(state) == final.keys
    for key, array in zip(final.keys, final.arrays):
        np.testing.assert_allclose(state[key].numpy(), array, err_msg=key)
    assert any(not np.array_equal(a, b) for a, b in zip(at_kill.arrays, final.arrays))
