"""Issue 29, found 8: a federation that aggregated nothing fails loudly.

Through the in-process engine (the real ServerApp, MLflow): two scripted sites
whose policy refuses every train instruction (``apps`` and ``min-batch-size``),
but answer evaluate. Before the fix the run ended as completed and registered
the untrained initial weights as ``<experiment>-best``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flwr.app import Context, Error, Message, MessageType
from mlflow.tracking import MlflowClient

from app.engine import VirtualSite, run_federation
from app.tracking.refusals import aggregated_any, refusal_counts
from strategies import message_keys as keys
from strategies.errors import FederationError
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
