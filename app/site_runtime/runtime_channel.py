"""The site runner's HTTP channel to its SuperNode's Runtime API.

Flower's Runtime API clients are written for a ``flwr-clientapp`` process that
lives for one message, and they end that process when something goes wrong:
Flower's HTTP retry policy (``flwr.supercore.retry.make_simple_http_retry_invoker``)
sends ``SIGINT`` to its own process on HTTP 401 and raises
``RunNotRunningException`` (a ``BaseException``) on HTTP 403, and its task
heartbeat (``make_task_heartbeat_fn_http``) raises ``SIGINT`` when the SuperNode
answers that the task is over. The site runner lives in the hospital's node
process (:mod:`app.site_runtime.site_node`), beside the SuperNode: either would
stop the whole site. A task's token is revoked (HTTP 401) as soon as the
SuperNode finishes the task itself, e.g. when its run stopped while the
message's arrays were still on their way (:func:`app.site_runtime.site_node.cap_supernode_waits`).

Here a revoked or refused token is a :class:`TaskWithdrawn` error for the one
task, and the runner goes on with the next.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import httpx
from flwr.app import Context, Message
from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
from flwr.proto.node_pb2 import Node  # pylint: disable=E0611
from flwr.proto.runtime_pb2 import (  # pylint: disable=E0611
    PullAppMessagesRequest,
    PullTaskInputRequest,
    SendTaskHeartbeatRequest,
)
from flwr.supercore.inflatable.inflatable_protobuf_utils import (
    make_confirm_message_received_fn_protobuf,
    make_pull_object_fn_protobuf,
)
from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
from flwr.supercore.retry import RetryInvoker, make_simple_http_retry_invoker
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.task_identity import TaskIdentity

from app.tooling.errors import FlowerProcessError
from app.site_runtime.node_signals import NodeSignals

__all__ = ["TaskWithdrawn", "PULL_BACKOFF", "RECEIPT_WAIT", "RECEIPT_BACKOFF",
           "WITHDRAWN_STATUS", "withdrawn",
           "runtime_retry_invoker", "task_heartbeat_fn", "pull_task_input"]

#: HTTP statuses of a task token the SuperNode no longer honours (revoked, run over).
WITHDRAWN_STATUS = frozenset({httpx.codes.UNAUTHORIZED, httpx.codes.FORBIDDEN})

#: Backoff while the SuperNode is still receiving the message's objects from the
#: SuperLink. The task exists as soon as the message's header is stored, before its
#: arrays arrived; Flower's pull backs off 1, 2, 4, 8, 10, 10... s (``PULL_INITIAL_BACKOFF``,
#: ``PULL_BACKOFF_CAP``), so an array that arrives after 16 s is read after 25 s.
PULL_BACKOFF = (0.05, 0.5)

#: With the SuperNode's receipt signal (:class:`~app.site_runtime.node_signals.NodeSignals`):
#: the longest wait for it before a pull is tried anyway (a fallback that costs one
#: loopback request), and Flower's backoff between tries, short since the wait paces them.
RECEIPT_WAIT = 0.5
RECEIPT_BACKOFF = (0.005, 0.005)


class TaskWithdrawn(FlowerProcessError):
    """The SuperNode finished a task this runner holds (its token is no longer valid)."""


def withdrawn(exc: BaseException) -> bool:
    """Whether ``exc`` is the Runtime API refusing a task token (HTTP 401 or 403)."""
    return (isinstance(exc, TaskWithdrawn) or isinstance(exc, httpx.HTTPStatusError)
            and exc.response.status_code in WITHDRAWN_STATUS)


def runtime_retry_invoker() -> RetryInvoker:
    """Flower's HTTP retry policy, except that 401 and 403 give up with the HTTP error.

    Flower's policy signals the process (401) or raises a ``BaseException`` (403);
    this one re-raises the ``httpx.HTTPStatusError`` at once, so the caller can
    drop the task (:func:`withdrawn`). Transport errors and 502/503/504 are
    retried with Flower's backoff, as before.
    """
    invoker = make_simple_http_retry_invoker()
    flower_giveup = invoker.should_giveup

    def should_giveup(exc: Exception) -> bool:
        if withdrawn(exc):
            return True
        return bool(flower_giveup(exc)) if flower_giveup is not None else False

    invoker.should_giveup = should_giveup
    return invoker


def task_heartbeat_fn(client: RuntimeHttpClient, gone: threading.Event) -> Callable[[], bool]:
    """A task heartbeat for Flower's ``HeartbeatSender`` that sets ``gone`` instead of SIGINT.

    Returns False (Flower retries) on transport errors and 503/504; a refused token
    or an unsuccessful answer sets ``gone`` and stops asking (returns True).
    """
    request = SendTaskHeartbeatRequest()

    def heartbeat() -> bool:
        if gone.is_set():
            return True
        try:
            response = client.SendTaskHeartbeat(request)
        except httpx.TransportError:
            return False
        except httpx.HTTPStatusError as err:
            if withdrawn(err):
                gone.set()
                return True
            return False
        if not response.success:
            gone.set()
        return True

    return heartbeat


def pull_task_input(client: RuntimeHttpClient, signals: NodeSignals | None = None
                    ) -> tuple[Message, Context, Any, Any]:
    """Flower's ``run_clientapp.pull_task_input`` with the short :data:`PULL_BACKOFF`.

    With ``signals`` (the SuperNode runs in this process) each object pull first
    waits for the SuperNode's receipt of the message (at most
    :data:`RECEIPT_WAIT` s at a time) and Flower's backoff between tries is
    :data:`RECEIPT_BACKOFF`: the objects are read as soon as they are there
    instead of up to a backoff later.

    Raises :class:`TaskWithdrawn` when the SuperNode revoked the task's token while
    its arrays were still being pulled (the pull would otherwise wait for arrays
    that never come).
    """
    task = "a task"
    try:
        res = client.PullTaskInput(PullTaskInputRequest())
        task = f"task {res.task_id} (run {res.run.run_id})"
        TaskIdentity.task_id = res.task_id
        TaskIdentity.run_id = res.run.run_id
        TaskIdentity.node_id = res.context.node_id
        context = context_from_proto(res.context)
        pulled = client.PullMessages(PullAppMessagesRequest())
        if not pulled.messages_list:
            raise FlowerProcessError("no message from the SuperNode's Runtime API")
        node = Node(node_id=context.node_id)
        tree = pulled.message_object_trees[0]
        pull_object = make_pull_object_fn_protobuf(client.PullObject, node, context.run_id)
        backoff = PULL_BACKOFF
        if signals is not None:
            pull_object = signals.after_receipt(tree.object_id, pull_object, RECEIPT_WAIT)
            backoff = RECEIPT_BACKOFF
        message = pull_and_inflate_object_from_tree(
            tree, pull_object,
            make_confirm_message_received_fn_protobuf(client.ConfirmMessageReceived, node,
                                                      context.run_id),
            return_type=Message, max_tries_per_object=None, initial_backoff=backoff[0],
            backoff_cap=backoff[1])
    except httpx.HTTPStatusError as err:
        if withdrawn(err):
            raise TaskWithdrawn(
                f"{task}: the SuperNode finished it before its message "
                f"arrived (HTTP {err.response.status_code}; its run stopped, or the message's "
                "arrays could not be received)") from None
        raise
    message.metadata.__dict__["_message_id"] = tree.object_id
    return message, context, run_from_proto(res.run), fab_from_proto(res.fab)
