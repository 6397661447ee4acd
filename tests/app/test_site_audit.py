"""The site runtime audits every message it receives: what was asked, what it decided, the
rule of a refusal, the bytes that left, the epsilon its ledgers were charged; policy changes
once per fingerprint; the node's status for the console."""

from __future__ import annotations

import json
from datetime import date
from types import SimpleNamespace

import pytest
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from app.site_errors import error_reply
from app.site_runtime.audit_chain import verify_chain
from app.site_runtime import site_runner
from app.site_runtime.app_approval import SIGNATURE_KEY, fab_sha256, keygen, sign_app
from app.site_runtime.audit_log import AuditLog
from app.site_runtime.console_apps import apps_view
from app.site_runtime.audit_record import decision_of, message_record
from app.site_runtime.site_audit import STATUS_NAME, SiteAudit
from app.site_runtime.site_runner import SiteRunner
from clients.site.app_rules import key_fingerprint, load_public_key
from clients.site.policy import PolicyRefusal, load_policy
from strategies.wire import message_keys as keys
from tests.app.site_messages import instruction

FAB = b"PK\x03\x04 a stand-in bundle"


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    """The task identity ``Message(...)`` reads, as pull_task_input sets it."""
    for name, value in (("_task_id", 3), ("_run_id", 1), ("_node_id", 7)):
        monkeypatch.setattr(TaskIdentity, name, value)


@pytest.fixture
def site(tmp_path):
    """A site's data folder, state dir, a policy approving no app, and a runner over them."""
    data, state = tmp_path / "data", tmp_path / "state"
    data.mkdir()
    policy = tmp_path / "policy.toml"
    policy.write_text("[apps]\nany = false\n")
    node_config = {"site-name": "hospital-a", "data-path": str(data), "state-dir": str(state),
                   "policy-path": str(policy)}
    return SimpleNamespace(data=data, state=state, policy=policy, node_config=node_config,
                           runner=SiteRunner("127.0.0.1:9", policy))


def _context(node_config: dict, **run_config) -> Context:
    return Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(),
                   run_config={"task": "cxr-cls", "batch-size": 16, **run_config})


def _refused(site, message: Message) -> dict:
    context = _context(site.node_config, **{"privacy.noise-multiplier": 1.1})
    fab = SimpleNamespace(hash_str=fab_sha256(FAB), content=FAB)
    answer = site.runner._answer(message, context, SimpleNamespace(), fab)
    return site.runner.audit(message, answer.reply, answer.context, fab.hash_str, 0.25,
                             answer.epsilon)


def test_a_refused_app_is_audited_with_its_rule_and_what_was_asked(site):
    message = instruction("train", **{keys.LOCAL_STEPS: 10, keys.CODEC: "topk:0.1",
                                      keys.FEDERATION: "fed-1"})
    written = _refused(site, message)
    records = list(AuditLog(site.state).records())
    assert [r["kind"] for r in records] == ["policy-change", "message"]
    record = records[-1]
    assert record == written
    assert (record["decision"], record["rule"], record["error_code"]) == (
        "refused", "apps", keys.APP_REFUSAL_CODE)
    assert record["type"] == "train" and record["federation"] == "fed-1"
    assert record["app"] == fab_sha256(FAB) and record["site"] == "hospital-a"
    assert record["asked"] == {"task": "cxr-cls", "batch-size": 16, "local-steps": 10,
                               "codec": "topk:0.1", "server-round": 1,
                               "privacy.noise-multiplier": 1.1}
    assert record["bytes_sent"] == 0 and record["epsilon"] == 0.0
    assert "/" not in json.dumps(record)  # never a path
    assert verify_chain(site.state).ok


def test_a_policy_change_is_audited_once_per_fingerprint(site):
    for _ in range(2):
        _refused(site, instruction("evaluate"))
    site.policy.write_text(f"# edited by hand\n[apps]\nany = false\n"
                           f"revoked-sha256 = [\"{'a' * 64}\"]\n")
    _refused(site, instruction("evaluate"))
    kinds = [r["kind"] for r in AuditLog(site.state).records()]
    assert kinds == ["policy-change", "message", "message", "policy-change", "message"]
    changes = [r for r in AuditLog(site.state).records() if r["kind"] == "policy-change"]
    assert changes[1]["previous"] == changes[0]["fingerprint"] != changes[1]["fingerprint"]


def test_decisions_and_rules_of_replies():
    message = instruction("train")
    context = _context({"site-name": "h"})
    refusal = error_reply(message, context, PolicyRefusal("min-batch-size", "8 < 16"))
    assert decision_of(refusal) == ("refused", "min-batch-size", keys.POLICY_REFUSAL_CODE)
    failure = error_reply(message, context, RuntimeError("/secret/path"))
    assert decision_of(failure) == ("failed", None, 4000)
    answer = Message(RecordDict({keys.METRICS: MetricRecord({keys.NUM_EXAMPLES: 3}),
                                 keys.CONFIG: ConfigRecord({"x": "y"})}), reply_to=message)
    assert decision_of(answer) == ("answered", None, None)
    record = message_record(message, answer, context, "0" * 64, 1.0, 0.5)
    assert record["bytes_sent"] > 0 and record["epsilon"] == 0.5


def test_the_node_audits_its_start_and_keeps_its_status(tmp_path):
    audit = SiteAudit(tmp_path, "hospital-a")
    audit.node_started("abcd")
    status = json.loads((tmp_path / "audit" / STATUS_NAME).read_text())
    assert status["site"] == "hospital-a" and status["runtime_api"] == "unreachable"
    audit.status(reached=True, force=True)
    assert json.loads((tmp_path / "audit" / STATUS_NAME).read_text())["runtime_api"] == "ok"
    kinds = [(r["kind"], r.get("policy", r.get("fingerprint"))) for r in
             AuditLog(tmp_path).records()]
    assert kinds == [("node-start", "abcd"), ("policy-change", "abcd")]


def test_a_signed_bundle_is_audited_with_its_key_and_expiry(site, tmp_path, monkeypatch):
    _, public = keygen(tmp_path / "keys")
    digest = fab_sha256(FAB)
    signature = sign_app(digest, tmp_path / "keys" / "app-signing.key", date(2099, 1, 31))
    site.policy.write_text(f'[apps]\nany = false\ntrusted-keys = ["{public}"]\n')
    monkeypatch.setattr(site_runner, "verified_install", lambda content: (tmp_path, []))
    message = instruction("evaluate")

    def worker(key, job, launch):  # the genuine app's evaluate reply (its copy of the rules)
        fingerprint = load_policy(job["context"].node_config["policy-path"]).fingerprint
        return ("done", Message(RecordDict({
            keys.METRICS: MetricRecord({keys.NUM_EXAMPLES: 3}),
            keys.SITE: ConfigRecord({keys.SITE_NAME: "hospital-a", keys.SITE_POLICY: fingerprint})}),
            reply_to=message), job["context"])

    monkeypatch.setattr(site.runner.pool, "run", worker)
    context = _context(site.node_config, **{SIGNATURE_KEY: signature})
    fab = SimpleNamespace(hash_str=digest, content=FAB)
    answer = site.runner._answer(message, context, SimpleNamespace(
        run_id=1, fab_id="fedmed", fab_version="0.1.0"), fab)
    record = site.runner.audit(message, answer.reply, answer.context, digest, 0.1,
                               answer.epsilon)
    fingerprint = key_fingerprint(load_public_key(public))
    assert (record["decision"], record["approval"], record["signature_expires"]) == (
        "answered", f"key {fingerprint}", "2099-01-31")
    rules = load_policy(site.policy).apps
    seen = apps_view(rules, list(AuditLog(site.state).records()))["seen"]
    assert seen[0]["standing"] == (f"approved by the signature of key {fingerprint} (last run), "
                                   "valid through 2099-01-31")
