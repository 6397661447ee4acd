"""Nothing on a message's path between the SuperNode and the site runner is polled.

Found in the site-overhead trace (issue 14, 2026-11-24 11:28, idle machine): the
SuperNode creates a message's task before it has the message's objects; the
runner's pull of them failed and backed off (up to 0.5 s) and read them 0.27-0.37 s
after the SuperNode had them; the SuperNode found the runner's reply only at its
next 0.25 s look; and the runner asked for a new task 20 times a second.
:class:`NodeSignals` carries a wake-up for each; these tests run Flower 1.41's own
``_pull_and_store_message`` with the hooks of ``cap_supernode_waits``.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.app.message import remove_content_from_message
from flwr.common.serde import context_to_proto, fab_to_proto, message_to_proto, run_to_proto
from flwr.proto.message_pb2 import ConfirmMessageReceivedResponse  # pylint: disable=E0611
from flwr.proto.message_pb2 import PullObjectResponse  # pylint: disable=E0611
from flwr.proto.runtime_pb2 import (  # pylint: disable=E0611
    AcquireTaskResponse,
    PullAppMessagesResponse,
    PullTaskInputResponse,
)
from flwr.supercore.fab import Fab
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree
from flwr.supercore.inflatable import inflatable_utils
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from flwr.supernode.nodestate import NodeStateFactory

from app.site_runtime import runtime_channel, site_node, site_runner
from app.site_runtime.node_signals import NodeSignals
from app.site_runtime.runtime_round import RuntimeAnswer
from app.site_runtime.site_runner import SiteRunner

#: The development policy (any app), the site runner's --policy in these tests.
PERMISSIVE = Path(__file__).resolve().parents[2] / "configs" / "site-policy-permissive.toml"


@pytest.fixture
def supernode_loop(monkeypatch):
    """Flower's SuperNode loop module, its patched names restored after the test."""
    import flwr.supernode.start_client_internal as loop
    for name in ("time", "pull_objects", "_pull_and_store_message"):
        monkeypatch.setattr(loop, name, getattr(loop, name))
    return loop


def _message() -> Message:
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 5, 7
    message = Message(RecordDict({"arrays": ArrayRecord([np.ones(3, dtype=np.float32)]),
                                  "config": ConfigRecord({"round": 2})}),
                      dst_node_id=7, message_type="train")
    message.metadata.__dict__["_message_id"] = message.object_id
    return message


def _objects(message: Message) -> dict[str, bytes]:
    return {oid: obj.deflate() for oid, obj in get_all_nested_objects(message).items()}


def test_the_supernode_signals_the_task_before_its_pull_and_the_receipt_before_confirming(
        supernode_loop):
    signals = NodeSignals()
    site_node.cap_supernode_waits(0.05, signals)
    state = NodeStateFactory(ObjectStoreFactory()).state()
    state.set_node_id(7)
    state.store_run(Run.create_empty(5))  # a known run: no FAB to fetch
    message = _message()
    objects, seen = _objects(message), []

    def pull_object(run_id: int, object_id: str) -> bytes:
        seen.append(("pull", signals.task_created.is_set(), state.get_tasks() != []))
        return objects[object_id]

    def confirm(run_id: int, message_id: str) -> None:
        seen.append(("confirm", signals.received_at(message_id) is not None,
                     state.object_store.get(message_id) == objects[message_id]))

    run_id = supernode_loop._pull_and_store_message(  # pylint: disable=W0212
        state=state, object_store=state.object_store, node_config={},
        receive=lambda: (message, get_object_tree(message)), get_run=None, get_fab=None,
        pull_object=pull_object, confirm_message_received=confirm, trusted_entities=None)
    assert run_id == 5
    assert seen[:-1] == [("pull", True, True)] * len(objects)
    assert seen[-1] == ("confirm", True, True)  # stored, then told, then confirmed
    # the id the runner waits for is the object-tree root it pulls from the SuperNode
    assert state.object_store.get_object_tree(message.object_id).object_id == message.object_id


def test_the_supernode_waits_end_when_the_runner_stored_a_reply(supernode_loop):
    signals = NodeSignals()
    site_node.cap_supernode_waits(3600.0, signals)
    signals.reply_stored.set()
    supernode_loop.time.sleep(0.5)  # Flower's look for a reply: returns at once
    assert not signals.reply_stored.is_set()  # consumed: the next wait is a full one


class _SuperNodeRuntime:
    """The SuperNode's Runtime API for one message whose objects arrive later."""

    def __init__(self, message: Message, signals: NodeSignals) -> None:
        self.message, self.signals = message, signals
        self.objects = _objects(message)
        self.tries: list[bool] = []  # per PullObject: was the object there?
        self.received = False

    def receive(self) -> None:
        """What the SuperNode does once the SuperLink sent every object."""
        self.received = True
        self.signals.message_received(self.message.object_id)

    def PullTaskInput(self, request):  # noqa: N802 (Flower's names)
        context = Context(run_id=5, node_id=7, node_config={}, state=RecordDict(),
                          run_config={})
        return PullTaskInputResponse(context=context_to_proto(context),
                                     run=run_to_proto(Run.create_empty(5)),
                                     fab=fab_to_proto(Fab("ab" * 32, b"", {})), task_id=3)

    def PullMessages(self, request):  # noqa: N802
        threading.Timer(0.05, self.receive).start()
        return PullAppMessagesResponse(
            messages_list=[message_to_proto(remove_content_from_message(self.message))],
            message_object_trees=[get_object_tree(self.message)])

    def PullObject(self, request):  # noqa: N802
        self.tries.append(self.received)
        return PullObjectResponse(object_found=True, object_available=self.received,
                                  object_content=self.objects[request.object_id]
                                  if self.received else b"")

    def ConfirmMessageReceived(self, request):  # noqa: N802
        return ConfirmMessageReceivedResponse()


def test_the_runner_pulls_the_objects_once_the_supernode_has_them(monkeypatch):
    monkeypatch.setattr(runtime_channel, "RECEIPT_WAIT", 60.0)
    signals = NodeSignals()
    runtime = _SuperNodeRuntime(_message(), signals)
    message, _, _, _ = runtime_channel.pull_task_input(runtime, signals)
    assert message.content["config"]["round"] == 2
    assert runtime.tries == [True] * len(runtime.objects)  # no pull before the receipt
    assert signals.received_at(message.metadata.message_id) is not None


def test_the_runner_wakes_for_a_new_task_and_wakes_the_supernode_for_its_reply(monkeypatch):
    signals = NodeSignals()
    runner = SiteRunner("127.0.0.1:9", PERMISSIVE, poll_interval=60.0, signals=signals)
    asks, events, stop = [], [], threading.Event()

    def acquire(request):
        asks.append(1)
        if len(asks) == 1:
            signals.task_created.set()  # the SuperNode creates a task just after we asked
            return AcquireTaskResponse()
        stop.set()
        return SimpleNamespace(HasField=lambda name: True, token="t")

    client = SimpleNamespace(AcquireTask=acquire, close=lambda: None)
    monkeypatch.setattr(runner, "_client", lambda token=None: client)
    monkeypatch.setattr(runner, "handle", lambda token: events.append(("handled", token)))
    serving = threading.Thread(target=runner.serve, args=(stop,), daemon=True)
    serving.start()
    serving.join(timeout=30)  # a lost wake-up would wait the 60 s poll instead
    assert events == [("handled", "t")] and len(asks) == 2

    context = Context(run_id=5, node_id=7, node_config={}, state=RecordDict(), run_config={})
    message = _message()
    monkeypatch.setattr(site_runner, "pull_task_input",
                        lambda client, sig: (message, context, None, None))
    monkeypatch.setattr(runner, "_answer", lambda *a: RuntimeAnswer(message, context,
                                                                     "completed", ""))
    monkeypatch.setattr(site_runner, "push_message", lambda *a: events.append(
        ("reply pushed", signals.reply_stored.is_set())))
    monkeypatch.setattr(site_runner, "push_task_output", lambda *a: events.append(
        ("output pushed", signals.reply_stored.is_set())))
    monkeypatch.setattr(site_runner, "HeartbeatSender", lambda fn: SimpleNamespace(
        start=lambda: None, stop=lambda: None))
    SiteRunner.handle(runner, "t")
    assert events[1:] == [("reply pushed", False), ("output pushed", True)]


def test_widen_transfers_lifts_flowers_core_cap(monkeypatch):
    monkeypatch.setattr(inflatable_utils, "get_num_workers", inflatable_utils.get_num_workers)
    site_node.widen_transfers(5)
    assert inflatable_utils.get_num_workers(2) == 5
    with pytest.raises(Exception, match="--transfer-lanes"):
        site_node.widen_transfers(0)


def test_received_ids_are_bounded_and_a_missing_receipt_times_out():
    signals = NodeSignals(remembered=2)
    for message_id in ("a", "b", "c"):
        signals.message_received(message_id)
    assert signals.received_at("a") is None and signals.received_at("c") is not None
    assert signals.wait_received("b", 0.0) and not signals.wait_received("z", 0.01)
    with pytest.raises(ValueError):
        NodeSignals(remembered=0)
