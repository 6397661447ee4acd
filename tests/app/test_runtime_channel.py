"""A run that stops while a site is receiving its message must not stall or kill the site.

Found in CI (test_deployment_faults, resume after a killed SuperLink): the
restarted SuperLink refuses the old run's arrays with HTTP 403; Flower's
SuperNode ignores the resulting ``RunNotRunningException`` (a BaseException)
and leaves the message's task open; the site runner that acquired it pulled its
arrays forever and the site answered no later round. And Flower's retry policy
SIGINTs its own process on HTTP 401 (a revoked task token), which in our node
process is the SuperNode itself.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from flwr.supercore.run import RunNotRunningException

from app.site_runtime import site_node
from app.site_runtime.runtime_channel import (
    TaskWithdrawn,
    pull_task_input,
    runtime_retry_invoker,
    task_heartbeat_fn,
)
from app.site_runtime.site_runner import SiteRunner

#: The development policy (any app), the site runner's --policy in these tests.
PERMISSIVE = Path(__file__).resolve().parents[2] / "configs" / "site-policy-permissive.toml"


def _http_error(status: int) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://127.0.0.1:9/runtime")
    response = httpx.Response(status, request=request,
                              json={"code": 1008, "message": "authentication failed"})
    return httpx.HTTPStatusError(f"HTTP {status}", request=request, response=response)


@pytest.fixture
def no_signals(monkeypatch):
    """Fail the test instead of signalling this process (Flower's reaction to a 401)."""
    def refuse(*args):
        raise AssertionError(f"the process was signalled: {args}")
    monkeypatch.setattr(os, "kill", refuse)
    monkeypatch.setattr("signal.raise_signal", refuse)


def test_a_run_that_stopped_during_the_object_pull_is_an_ordinary_error():
    def refused(object_id: str) -> bytes:
        raise RunNotRunningException

    with pytest.raises(Exception) as caught:  # Flower's branch that finishes the task
        site_node.pull_objects_of_running_run(["a" * 64, "b" * 64], refused,
                                              initial_backoff=0.01, backoff_cap=0.01)
    assert isinstance(caught.value, site_node.RunStoppedDuringPull)


def test_cap_supernode_waits_installs_the_run_aware_pull(monkeypatch):
    import flwr.supernode.start_client_internal as supernode_loop
    monkeypatch.setattr(supernode_loop, "time", supernode_loop.time)
    monkeypatch.setattr(supernode_loop, "pull_objects", supernode_loop.pull_objects)
    site_node.cap_supernode_waits(0.25)
    assert supernode_loop.pull_objects.func is site_node.pull_objects_of_running_run
    assert supernode_loop.pull_objects.keywords["backoff_cap"] == 0.25
    with pytest.raises(site_node.RunStoppedDuringPull):
        supernode_loop.pull_objects(["c" * 64], lambda _: (_ for _ in ()).throw(
            RunNotRunningException()))


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_task_token_gives_up_with_the_http_error(status, no_signals):
    calls = []

    def refused() -> None:
        calls.append(1)
        raise _http_error(status)

    with pytest.raises(httpx.HTTPStatusError):
        runtime_retry_invoker().invoke(refused)
    assert calls == [1]


def test_unavailable_runtime_api_is_still_retried(no_signals):
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 2:
            raise _http_error(503)
        return "ok"

    invoker = runtime_retry_invoker()
    invoker.wait_function = lambda _: None
    assert invoker.invoke(flaky) == "ok" and len(calls) == 2


def test_heartbeat_of_a_withdrawn_task_sets_gone_instead_of_signalling(no_signals):
    gone = threading.Event()
    client = SimpleNamespace(SendTaskHeartbeat=lambda _: SimpleNamespace(success=False))
    assert task_heartbeat_fn(client, gone)() is True and gone.is_set()

    gone = threading.Event()
    def revoked(_):
        raise _http_error(401)
    assert task_heartbeat_fn(SimpleNamespace(SendTaskHeartbeat=revoked), gone)() is True
    assert gone.is_set()

    gone = threading.Event()
    def down(_):
        raise httpx.ConnectError("refused")
    assert task_heartbeat_fn(SimpleNamespace(SendTaskHeartbeat=down), gone)() is False
    assert not gone.is_set()


class _RevokedClient:
    """A Runtime API client whose task token the SuperNode revoked: every call is a 401."""

    def __init__(self) -> None:
        self.invoker = runtime_retry_invoker()
        self.outputs = []
        self.closed = False

    def __getattr__(self, name):
        def call(request):
            return self.invoker.invoke(lambda: (_ for _ in ()).throw(_http_error(401)))
        return call

    def PushTaskOutput(self, request):  # noqa: N802 (Flower's name)
        self.outputs.append(request)
        return self.invoker.invoke(lambda: (_ for _ in ()).throw(_http_error(401)))

    def close(self) -> None:
        self.closed = True


def test_pull_task_input_of_a_revoked_task_raises_task_withdrawn(no_signals):
    with pytest.raises(TaskWithdrawn, match="HTTP 401"):
        pull_task_input(_RevokedClient())


def test_the_runner_drops_a_withdrawn_task_and_stays_up(monkeypatch, no_signals, caplog):
    client = _RevokedClient()
    runner = SiteRunner("127.0.0.1:9", PERMISSIVE)
    monkeypatch.setattr(runner, "_client", lambda token=None: client)
    runner.handle("token")  # returns: the runner goes on with the next task
    assert client.closed and client.outputs == []
    assert "dropped" in caplog.text
