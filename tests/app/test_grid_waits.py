"""The ServerApp reads a reply whose arrays come just after its header without Flower's 1 s waits.

Found measuring bench/site_overhead.py: a SuperNode sends a reply's header
before its arrays, and the ServerApp's grid backs off 1, 2, 4 s on an array not
uploaded yet. These tests drive Flower's own ``HttpGrid.pull_messages`` with a
Runtime API whose objects become available only after a few asks, and record
the waits Flower's ``pull_objects`` asks for between the asks.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest
import flwr.superlink.grid.http_grid as http_grid
from flwr.app import ArrayRecord, Message, RecordDict
from flwr.app.message import remove_content_from_message
from flwr.common.serde import message_to_proto
from flwr.proto.runtime_pb2 import PullAppMessagesResponse  # pylint: disable=E0611
from flwr.proto.message_pb2 import PullObjectResponse  # pylint: disable=E0611
from flwr.supercore.inflatable import inflatable_utils
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree
from flwr.supercore.run import Run

from app.grid_waits import REPLY_PULL_BACKOFF, cap_grid_waits


class _WaitRecorder(threading.Event):
    """Flower's pull waits on an Event between two asks: record the wait, return at once."""

    waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            _WaitRecorder.waits.append(timeout)
        return self.is_set()


class _LateArraysRuntime:
    """A SuperLink Runtime API holding one reply; each of its objects is unavailable at first.

    Each object (message, record dict, array record, array) answers "not uploaded
    yet" to its first ``unavailable_asks`` asks.
    """

    def __init__(self, reply: Message, unavailable_asks: int) -> None:
        self.contents = {oid: obj.deflate() for oid, obj in get_all_nested_objects(reply).items()}
        self.proto = message_to_proto(remove_content_from_message(reply))
        self.tree = get_object_tree(reply)
        self.unavailable = unavailable_asks
        self.asks = dict.fromkeys(self.contents, 0)

    def PullMessages(self, request):  # noqa: N802 (Flower's API name)
        return PullAppMessagesResponse(messages_list=[self.proto],
                                       message_object_trees=[self.tree])

    def PullObject(self, request):  # noqa: N802
        self.asks[request.object_id] += 1
        if self.asks[request.object_id] <= self.unavailable:
            return PullObjectResponse(object_found=True, object_available=False)
        return PullObjectResponse(object_found=True, object_available=True,
                                  object_content=self.contents[request.object_id])

    def ConfirmMessageReceived(self, request):  # noqa: N802
        return SimpleNamespace()


@pytest.fixture
def flower_pull(monkeypatch):
    """Restore the grid's ``pull_objects``; record the waits of Flower's object pull."""
    monkeypatch.setattr(http_grid, "pull_objects", http_grid.pull_objects)
    monkeypatch.setattr(inflatable_utils, "threading",
                        SimpleNamespace(Event=_WaitRecorder, Lock=threading.Lock))
    monkeypatch.setattr(_WaitRecorder, "waits", [])
    return _WaitRecorder.waits


def _pull_late_reply(unavailable_asks: int) -> tuple[list[Message], Message, int]:
    """Flower's grid pulls a reply whose objects are each unavailable ``unavailable_asks`` times;
    the replies it returns, the reply sent and its number of objects."""
    reply = Message(RecordDict({"arrays": ArrayRecord([np.arange(6.0).reshape(2, 3)])}),
                    dst_node_id=1, message_type="train")
    reply.metadata.__dict__["_message_id"] = reply.object_id
    grid = http_grid.HttpGrid(token="server-app-token")
    runtime = _LateArraysRuntime(reply, unavailable_asks)
    grid._client = runtime  # pylint: disable=W0212
    grid.set_run(Run.create_empty(42))
    return list(grid.pull_messages([reply.metadata.message_id])), reply, len(runtime.contents)


@pytest.mark.usefixtures("site_identity")
def test_a_reply_whose_arrays_come_late_is_read_with_short_waits(flower_pull):
    cap_grid_waits()
    got, reply, objects = _pull_late_reply(unavailable_asks=3)
    assert len(got) == 1 and not got[0].has_error()
    assert np.array_equal(got[0].content["arrays"].to_numpy_ndarrays()[0],
                          reply.content["arrays"].to_numpy_ndarrays()[0])
    assert len(flower_pull) == 3 * objects  # one wait after each unavailable ask
    first, cap = REPLY_PULL_BACKOFF
    assert flower_pull[0] <= first * 1.2 and max(flower_pull) <= cap * 1.2  # +-20% jitter


@pytest.mark.usefixtures("site_identity")
def test_the_wait_is_not_limited_by_a_count_of_asks(flower_pull):
    """Flower's 500 asks would be 2 minutes at the short backoff: an upload may take longer."""
    cap_grid_waits()
    got, _, objects = _pull_late_reply(unavailable_asks=600)
    assert len(got) == 1 and not got[0].has_error() and len(flower_pull) == 600 * objects


def test_cap_grid_waits_refuses_a_backoff_that_never_waits():
    with pytest.raises(ValueError, match="cap_grid_waits"):
        cap_grid_waits(initial=0.0)
    with pytest.raises(ValueError, match="cap_grid_waits"):
        cap_grid_waits(initial=0.5, cap=0.25)


def test_the_server_app_caps_the_grid_waits_before_anything_else(monkeypatch):
    """Review: nothing checked that the ServerApp installs the short backoff at all."""
    from app import server_app  # noqa: PLC0415 - torch, mlflow: only this test needs them

    class Capped(Exception):
        pass

    def capped() -> None:
        raise Capped

    monkeypatch.setattr(server_app, "cap_grid_waits", capped)
    with pytest.raises(Capped):
        server_app.main(None, None)  # the run config is not read before the cap
