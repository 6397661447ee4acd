"""The server's record of the site policies: refusals per site and round, fingerprints as params."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest
from flwr.app import ConfigRecord, Error, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from mlflow.tracking import MlflowClient

from app.tracking import FederationTracker, round_record
from app.tracking.tracker import policy_params
from strategies.rounds.reply_intake import InvalidReplyError, ReplyIntake, policy_fingerprint
from strategies.rounds.round_report import RoundReport
from strategies.rounds.site_book import SiteBook
from strategies.wire import message_keys as keys

REFUSED = "site reported an error: site hospital-b: policy rule min-batch-size (refused)"


def test_a_refusal_is_recorded_per_site_and_round_with_its_rule():
    report = RoundReport(server_round=2, train={"hospital-a": {"train-loss": 0.5}},
                         train_dropped={"hospital-b": REFUSED, "hospital-c": "NaN in update"},
                         evaluate_dropped={"hospital-d": REFUSED.replace("min-batch-size",
                                                                         "allowed-tasks")})
    record = round_record(report)
    assert record.metrics["site/hospital-b/refused"] == 1.0
    assert record.metrics["site/hospital-d/refused"] == 1.0
    assert "site/hospital-c/refused" not in record.metrics  # dropped, but not a refusal
    assert "site/hospital-a/refused" not in record.metrics
    assert record.metrics["site/hospital-b/failed"] == 1.0
    dropped = record.artifacts["rounds/round-002-dropped.json"]
    assert "policy rule min-batch-size" in dropped["train/hospital-b"]


def test_policy_params_name_each_site_once_and_each_change():
    known: dict[str, str] = {}
    first = RoundReport(server_round=1, policies={"hospital-a": "aaaa", "hospital-b": "bbbb"})
    assert policy_params(first, known) == {"site/hospital-a/policy": "aaaa",
                                           "site/hospital-b/policy": "bbbb"}
    assert policy_params(RoundReport(server_round=2, policies={"hospital-a": "aaaa"}),
                         known) == {}
    changed = RoundReport(server_round=3, policies={"hospital-a": "cccc"})
    assert policy_params(changed, known) == {"site/hospital-a/policy-round-3": "cccc"}


@pytest.fixture()
def site_identity():
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 42, 1
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


def test_the_intake_keeps_fingerprints_and_names_a_refusal_by_its_site(site_identity):
    """Found: a refusal from a site not yet bound to its node was recorded as node-<id>."""
    def instruction(node: int) -> Message:
        return Message(RecordDict({keys.CONFIG: ConfigRecord()}), dst_node_id=node,
                       message_type=MessageType.EVALUATE)

    good = Message(RecordDict({keys.SITE: ConfigRecord({keys.SITE_NAME: "hospital-a",
                                                        keys.SITE_POLICY: "abcd"})}),
                   reply_to=instruction(5))
    refused = Message(Error(code=keys.POLICY_REFUSAL_CODE,
                            reason="site hospital-b: policy rule min-batch-size (refused)"),
                      reply_to=instruction(6))
    assert policy_fingerprint(good) == "abcd" and policy_fingerprint(refused) == ""

    def parse(message: Message, node_id: int):
        if message.has_error():
            raise InvalidReplyError(message.error.reason)
        return type("Reply", (), {"site": "hospital-a"})()

    intake = ReplyIntake("aggregate_evaluate", SiteBook(), parse, {5: "node-5", 6: "node-6"})
    taken = intake.take_all([good, refused])
    assert len(taken.accepted) == 1 and taken.policies == {"hospital-a": "abcd"}
    assert "policy rule min-batch-size" in taken.dropped["hospital-b"]


def test_fingerprints_reach_mlflow_as_params_and_a_change_never_stalls_the_outbox(
        tmp_path, mlflow_store):
    uri = mlflow_store(tmp_path)
    tracker = FederationTracker("pe-seg", tracking_uri=uri, artifact_root=str(tmp_path / "a"),
                                experiment="policy")
    run_id = tracker.start("run", params={}, tags={})
    try:
        tracker.log_round(RoundReport(server_round=1, policies={"hospital-a": "aaaa"}))
        # A resumed server forgets what it logged; the site meanwhile changed its policy.
        resumed = FederationTracker("pe-seg", tracking_uri=uri, experiment="policy")
        resumed.run_id = run_id
        resumed.log_round(RoundReport(server_round=2, policies={"hospital-a": "bbbb"}))
        assert not resumed.outbox.pending  # the round still reached MLflow
    finally:
        while mlflow.active_run() is not None:
            mlflow.end_run()
    run = MlflowClient(uri).get_run(run_id)
    assert run.data.params["site/hospital-a/policy"] == "aaaa"
    steps = [m.step for m in MlflowClient(uri).get_metric_history(run_id, "round-seconds")]
    assert sorted(steps) == [1, 2]


def test_each_sites_reply_seconds_are_a_metric_per_stage():
    report = RoundReport(server_round=1, reply_seconds={
        "hospital-a": {"train-reply-seconds": 0.4, "evaluate-reply-seconds": 0.2}})
    record = round_record(report)
    assert record.metrics["site/hospital-a/train-reply-seconds"] == 0.4
    assert record.metrics["site/hospital-a/evaluate-reply-seconds"] == 0.2
