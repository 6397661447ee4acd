"""The federation id in a message's audit record (app/site_runtime/audit_record.py): kept when
short and plain, else recorded as its hash, never blank (#44: ids over 64 characters or
holding ``/`` were recorded as ``""`` although the site accepts them)."""

from __future__ import annotations

import hashlib

import pytest
from flwr.app import Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from app.site_runtime.audit_record import federation_label, message_record
from strategies.wire import message_keys as keys
from tests.app.site_messages import instruction


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    """The task identity ``Message(...)`` reads, as pull_task_input sets it."""
    for name, value in (("_task_id", 3), ("_run_id", 1), ("_node_id", 7)):
        monkeypatch.setattr(TaskIdentity, name, value)


def _recorded(federation: str) -> str:
    message = instruction("train", **{keys.FEDERATION: federation})
    context = Context(run_id=1, node_id=7, node_config={"site-name": "h"}, state=RecordDict(),
                      run_config={})
    reply = Message(RecordDict(), reply_to=message)
    return message_record(message, reply, context, "0" * 64, 1.0, 0.0)["federation"]


def _hashed(federation: str) -> str:
    return "sha256:" + hashlib.sha256(federation.encode()).hexdigest()[:16]


@pytest.mark.parametrize("federation", ["a/b", "x" * 65, "fed 1", "../../etc", "fédé",
                                        "sha256:0123456789abcdef"])
def test_an_id_that_does_not_fit_is_recorded_as_its_hash(federation):
    assert _recorded(federation) == _hashed(federation)


@pytest.mark.parametrize("federation", ["fed-pe-seg", "a_b", "run.42", "x" * 64])
def test_a_short_plain_id_is_recorded_as_it_is(federation):
    assert _recorded(federation) == federation


def test_ids_that_share_a_folder_name_do_not_share_a_label():
    assert len({federation_label(f) for f in ("a/b", "a_b", "a\\b")}) == 3


def test_no_id_is_recorded_as_blank():
    assert federation_label(None) == federation_label("") == ""
    assert federation_label(12) == "12"
