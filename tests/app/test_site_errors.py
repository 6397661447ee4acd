"""What a site answers when it cannot or will not do a request: sanitised error replies.

Handler level: the ClientApp's train / evaluate / query with a real Flower
Message and Context; the site's data loading is replaced so that it fails or
so that the test can see whether it was reached.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from flwr.app import Context, Message, RecordDict

from app import client_app
from app.site_errors import error_code
from clients.site.site_round import SiteTasks
from clients.training.trainer import select_device
from clients.site.policy import PolicyRefusal, SitePolicy, load_policy
from clients.training.site_task import EvalResult
from strategies.wire import message_keys as keys
from strategies.wire.errors import ConfigError, ItemError, SiteError
from tests.app.site_messages import instruction

SECRET = "/srv/hospital-a/study-0042/dicom"
CPU = select_device("cpu")
pytestmark = pytest.mark.usefixtures("site_identity")


def _context(site: Path, policy: Path | None = None, run_config: dict | None = None
             ) -> Context:
    node_config = {"data-path": str(site), "site-name": "hospital-a"}
    if policy is not None:
        node_config["policy-path"] = str(policy)
    return Context(run_id=42, node_id=7, node_config=node_config, state=RecordDict(),
                   run_config=run_config or {})


def _handle(kind: str, msg: Message, context: Context) -> Message:
    return getattr(client_app, kind)(msg, context)


@pytest.fixture()
def loads(monkeypatch) -> list[Path]:
    """Record every attempt to load the site's data (and fail it: no data in these tests)."""
    seen: list[Path] = []

    def load_task(task, data_path, *args, **kwargs):
        seen.append(data_path)
        raise PermissionError(13, "Permission denied", SECRET)

    monkeypatch.setattr(client_app, "_TASKS", SiteTasks(load=load_task))
    return seen


@pytest.mark.parametrize("kind", ["train", "evaluate", "query"])
def test_a_permission_error_never_puts_its_path_into_the_reply(tmp_path, loads, kind):
    """Found: an unexpected OSError escaped the handler and Flower sent its text (a path)."""
    reply = _handle(kind, instruction(kind), _context(tmp_path))
    assert loads and reply.has_error()
    assert reply.error.code == 4000
    assert reply.error.reason == "site hospital-a: PermissionError (details in the site's log)"
    assert "study-0042" not in reply.error.reason and "/srv" not in reply.error.reason


@pytest.mark.parametrize("exc, code", [
    (PolicyRefusal("min-batch-size", f"see {SECRET}"), keys.POLICY_REFUSAL_CODE),
    (ConfigError(f"bad key in {SECRET}"), 4002),
    (SiteError(f"no studies in {SECRET}"), 4001),
    (ItemError(f"unreadable {SECRET}"), 4001),
    (ValueError(SECRET), 4000),
])
def test_each_error_class_has_a_fixed_code_and_no_text_leaves(tmp_path, monkeypatch, exc, code):
    def fail(*args, **kwargs):
        raise exc

    monkeypatch.setattr(client_app, "answer", fail)
    reply = client_app.train(instruction("train"), _context(tmp_path))
    assert error_code(exc) == code and reply.error.code == code
    assert SECRET not in reply.error.reason and "hospital-a" in reply.error.reason
    assert type(exc).__name__ in reply.error.reason or "policy rule" in reply.error.reason


def _policy(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("kind, text, request_config, rule", [
    ("train", "min-batch-size = 16\n", {}, "min-batch-size"),
    ("train", "max-local-steps = 10\n", {keys.LOCAL_STEPS: 11}, "max-local-steps"),
    ("train", "allowed-codecs = [\"qsgd\"]\n", {keys.CODEC: "topk:0.1"}, "allowed-codecs"),
    ("train", "[dp]\nrequired = true\n", {}, "dp.required"),
    ("evaluate", "allowed-tasks = [\"cxr-cls\"]\n", {}, "allowed-tasks"),
    ("query", "answer-queries = false\n", {}, "answer-queries"),
    ("query", "min-batch-size = 8\n", {keys.LOSS_SUBSET: 2}, "min-batch-size"),
])
def test_a_policy_violation_is_refused_before_any_data_is_read(
        tmp_path, loads, kind, text, request_config, rule):
    policy = _policy(tmp_path, text)
    reply = _handle(kind, instruction(kind, **request_config), _context(tmp_path, policy))
    assert not loads  # refused before the site's data was touched
    assert reply.error.code == keys.POLICY_REFUSAL_CODE
    assert reply.error.reason == f"site hospital-a: {keys.POLICY_RULE_PREFIX}{rule} (refused)"
    assert str(tmp_path) not in reply.error.reason


def test_an_invalid_policy_file_answers_nothing_and_names_no_path(tmp_path, loads):
    reply = client_app.train(instruction("train"), _context(tmp_path, _policy(tmp_path, "x = 1\n")))
    assert not loads and reply.error.code == 4002
    assert reply.error.reason == "site hospital-a: SitePolicyError (details in the site's log)"


def test_a_run_config_policy_is_ignored_by_a_deployed_site(tmp_path, loads):
    strict = _policy(tmp_path, "answer-queries = false\n")
    reply = client_app.query(instruction("query"), _context(tmp_path, run_config={"site-policy": str(strict)}))
    assert loads and reply.error.code == 4000  # it went on to the data: not refused


class _FakeTask:
    """A site task whose evaluation covers ``studies`` validation studies."""

    def __init__(self, studies: int) -> None:
        self.studies = studies

    def build_model(self, private: bool = False):
        return SimpleNamespace(load_state_dict=lambda state: None)

    def evaluate(self, model, compute, split="val"):
        return EvalResult(num_examples=10 * self.studies, loss=0.25, metrics={"dice": 0.5},
                          num_studies=self.studies)


@pytest.mark.parametrize("studies, released", [(2, False), (3, True)])
def test_validation_metrics_leave_only_from_enough_studies(tmp_path, monkeypatch, studies,
                                                           released):
    monkeypatch.setattr(client_app, "_TASKS", SiteTasks(lambda *a, **k: _FakeTask(studies), CPU))
    policy = _policy(tmp_path, "min-val-items = 3\n")
    reply = client_app.evaluate(instruction("evaluate"), _context(tmp_path, policy))
    metrics = dict(reply.content[keys.METRICS])
    assert metrics[keys.NUM_EXAMPLES] == 10 * studies and metrics["val-studies"] == studies
    assert (keys.VAL_LOSS in metrics and "val-dice" in metrics) is released
    if not released:
        assert set(metrics) == {keys.NUM_EXAMPLES, "val-studies"}
    site = reply.content[keys.SITE]
    assert site[keys.SITE_NAME] == "hospital-a"
    assert site[keys.SITE_POLICY] == load_policy(policy).fingerprint


def test_a_site_without_policy_path_reports_the_permissive_fingerprint(tmp_path, monkeypatch):
    monkeypatch.setattr(client_app, "_TASKS", SiteTasks(lambda *a, **k: _FakeTask(1), CPU))
    reply = client_app.evaluate(instruction("evaluate"), _context(tmp_path))
    assert reply.content[keys.SITE][keys.SITE_POLICY] == SitePolicy.permissive().fingerprint
    assert "val-dice" in dict(reply.content[keys.METRICS])
