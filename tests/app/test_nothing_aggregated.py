"""Issue 29, found 8: a federation that aggregated nothing fails loudly.

Through the in-process engine (the real ServerApp, MLflow): two scripted sites
whose policy refuses every train instruction (``apps`` and ``min-batch-size``),
but answer evaluate. Before the fix the run ended as completed and registered
the untrained initial weights as ``<experiment>-best``.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import numpy as np
import pytest
from flwr.app import Context, Error, Message, MessageType
from mlflow.tracking import MlflowClient

from app.engine import VirtualSite, run_federation
from app.tracking import FederationTracker
from app.tracking.tracker import aggregated_any, refusal_counts, require_aggregation
from strategies.wire import message_keys as keys
from strategies.wire.errors import FederationError
from strategies.rounds.checkpoint import (CHECKPOINT_FILE, ServerCheckpoint, load_checkpoint,
                                          run_folder, save_checkpoint)
from strategies.rounds.round_report import RoundReport
from tests.fixtures.scripted_site import ScriptedSite

ROUNDS = 2


def _refusing_train(site: ScriptedSite, rule: str):
    """``site``, refusing every train instruction under its policy's ``rule``."""
    def answer(message: Message, context: Context) -> Message:
        if message.metadata.message_type == MessageType.TRAIN:
            return Message(Error(code=keys.POLICY_REFUSAL_CODE, reason=(
                f"site {site.name}: {keys.POLICY_RULE_PREFIX}{rule} (refused)")),
                reply_to=message)
        return site(message, context)

    return answer


def test_a_run_where_every_site_refused_fails_unregistered(tmp_path, mlflow_store):
    store = mlflow_store(tmp_path / "store")
    sites = [VirtualSite({}, _refusing_train(ScriptedSite("site-a"), "apps")),
             VirtualSite({}, _refusing_train(ScriptedSite("site-b"), "min-batch-size"))]
    with pytest.raises(FederationError, match=r"apps: 2, min-batch-size: 2"):
        run_federation({
            "num-server-rounds": ROUNDS, "image-size": 16, "node-wait-timeout": 5,
            "experiment": "refused", "tracking-uri": store,
            "artifact-root": str(tmp_path / "artifacts"),
            "checkpoint-dir": str(tmp_path / "checkpoints")}, sites)
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("refused")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FAILED"
    assert run.data.tags["refusals"] == "apps: 2, min-batch-size: 2"
    artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
    assert json.loads((artifacts / "refusals.json").read_text()) == {
        "apps": 2, "min-batch-size": 2}
    assert client.search_model_versions("name='refused-best'") == []
    assert client.search_model_versions("name='refused-final'") == []
    assert client.search_logged_models(experiment_ids=[experiment.experiment_id]) == []
    assert "best-round" not in run.data.tags


def test_refusals_are_counted_by_rule_and_other_drops_apart():
    reports = {1: RoundReport(1, train_dropped={
                   "site-a": "site site-a: policy rule apps (refused)",
                   "site-b": "reply from node 7: not finite"}, missing={"train": 1}),
               2: RoundReport(2, train_dropped={
                   "site-a": "site site-a: policy rule apps (refused): unsigned"})}
    assert refusal_counts(reports) == {"apps": 2, "dropped": 1, "no reply": 1}
    assert not aggregated_any(reports)


def test_a_round_with_an_accepted_update_counts_unless_its_aggregation_failed():
    accepted = {"site-a": {"num-examples": 5.0}}
    assert aggregated_any({1: RoundReport(1), 2: RoundReport(2, train=accepted)})
    assert not aggregated_any({1: RoundReport(1, train=accepted,
                                              aggregation_failed="not finite")})


def test_a_resume_past_the_last_round_is_not_failed_for_running_no_round(tmp_path, mlflow_store):
    """A resume after the last round's checkpoint runs no round: its rounds aggregated before."""
    config = {"num-server-rounds": 1, "image-size": 16, "node-wait-timeout": 5,
              "experiment": "resumed", "tracking-uri": mlflow_store(tmp_path / "store"),
              "artifact-root": str(tmp_path / "artifacts"),
              "checkpoint-dir": str(tmp_path / "checkpoints")}
    first = run_federation(config, [VirtualSite({}, ScriptedSite(name))
                                    for name in ("site-a", "site-b")])
    resumed = run_federation({**config, "resume": True}, [VirtualSite({}, ScriptedSite(name))
                                                          for name in ("site-a", "site-b")])
    assert resumed.mlflow_run_id == first.mlflow_run_id and resumed.reports == {}
    assert resumed.models.final_version


def test_a_resume_whose_rounds_all_were_refused_fails_over_the_whole_federation(
        tmp_path, mlflow_store, monkeypatch):
    """Found 8 (b): the ServerApp dies after round 1's checkpoint, every train was refused
    before and after; the resumed run (rounds 2-3) fails too and registers nothing. It was
    not checked: it finished and registered the initial weights."""
    config = {"num-server-rounds": 3, "image-size": 16, "node-wait-timeout": 5,
              "experiment": "refused-resumed", "tracking-uri": mlflow_store(tmp_path / "store"),
              "artifact-root": str(tmp_path / "artifacts"),
              "checkpoint-dir": str(tmp_path / "checkpoints")}

    def refusing() -> list[VirtualSite]:
        return [VirtualSite({}, _refusing_train(ScriptedSite(name), "apps"))
                for name in ("site-a", "site-b")]

    flush, calls = FederationTracker.flush, []

    def killed_once(self, *args, **kwargs):  # the round-1 flush right after its checkpoint
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("ServerApp killed after round 1's checkpoint")
        return flush(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(FederationTracker, "flush", killed_once)
        with pytest.raises(RuntimeError, match="killed after round 1"):
            run_federation(config, refusing())
    with pytest.raises(FederationError, match=r"no round aggregated any update .*apps: 4"):
        run_federation({**config, "resume": True}, refusing())
    client = MlflowClient(config["tracking-uri"])
    experiment = client.get_experiment_by_name("refused-resumed")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FAILED"
    assert client.search_model_versions("name='refused-resumed-best'") == []
    assert client.search_model_versions("name='refused-resumed-final'") == []


def test_the_checkpoint_counts_the_rounds_that_aggregated(tmp_path):
    """A resume is checked against its checkpoint's count; an older checkpoint has none."""
    path = run_folder(tmp_path, "fed") / CHECKPOINT_FILE
    save_checkpoint(path, ServerCheckpoint(server_round=3, keys=["w"], arrays=[np.zeros(1)],
                                           strategy={}, mlflow_run_id="fed",
                                           aggregated_rounds=2))
    assert load_checkpoint(path, None).aggregated_rounds == 2
    refused = {4: RoundReport(4, train_dropped={"site-a": "policy rule apps (refused)"})}
    require_aggregation(refused, earlier=2)  # rounds before the checkpoint aggregated
    require_aggregation(refused, earlier=None)  # an older checkpoint: not counted, not checked
    with pytest.raises(FederationError, match="no round aggregated"):
        require_aggregation(refused, earlier=0)
    assert mlflow.active_run() is None  # no run of its own left active (it leaked into others)
