"""What the deployment tooling does for its operator when things go wrong (issue 47).

Walkthrough 3: ``make superlink | tee log``: Ctrl-C ends ``tee`` too, and the "stopping ..."
line went to a closed pipe; its BrokenPipeError skipped the stop and left the SuperLink
(and SuperNodes) running as orphans. Walkthrough 7: a SuperLink that does not answer is
named with what to do.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from app.tooling import deployment, flwr_cli
from app.tooling.daemon import spawn_daemon
from app.tooling.errors import FlowerProcessError


class ClosedPipe(io.TextIOBase):
    """A stdout whose reader has gone."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def test_ctrl_c_with_a_closed_pipe_still_stops_the_daemon(tmp_path, monkeypatch):
    log = tmp_path / "sleeper.log"
    daemon = spawn_daemon([sys.executable, "-c",
                           "import signal; print('up', flush=True); signal.pause()"],
                          dict(os.environ), log, "sleeper", cwd=tmp_path)
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    def interrupt_once_up() -> None:  # Ctrl-C once the daemon has written its first line
        deadline = time.monotonic() + 120
        while b"up" not in log.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    threading.Thread(target=interrupt_once_up, daemon=True).start()
    try:
        assert deployment._foreground(daemon, "sleeper", log) == 0
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        if daemon.process.poll() is None:
            daemon.stop()
            raise AssertionError("the daemon was left running")
    assert daemon.process.poll() is not None


def test_a_superlink_that_does_not_answer_is_named_with_what_to_do(tmp_path, monkeypatch):
    """Issue 47, walkthrough 7: 'cannot read the status of run ...: Connection to the
    SuperLink is unavailable' gave no hint to restart it and resume."""
    said = "Connection to the SuperLink is unavailable.\n"
    monkeypatch.setattr(flwr_cli, "flwr", lambda *a, **k: subprocess.CompletedProcess(
        ["flwr"], 1, stdout=said, stderr=""))
    with pytest.raises(FlowerProcessError, match=r"make superlink.*RESUME=1"):
        flwr_cli.run_status(tmp_path, "conn", 7)


def test_a_refused_supernode_activation_is_followed_by_what_to_do(tmp_path, monkeypatch):
    """Issue 47, walkthrough 7: '[code: 2004] Failed to activate SuperNode.' gave no reason."""
    log = tmp_path / "node.log"
    daemon = spawn_daemon([sys.executable, "-c", "print('ERROR: [code: 2004] Failed to "
                           "activate SuperNode.', flush=True)"], dict(os.environ), log,
                          "node", cwd=tmp_path)
    daemon.process.wait(timeout=60)
    shown = io.StringIO()
    monkeypatch.setattr(sys, "stdout", shown)
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        assert deployment._foreground(daemon, "node", log,
                                      deployment.supernode_hints("hospital-a")) == 1
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    text = shown.getvalue()
    assert text.count("fedmed register --site hospital-a") == 1
    assert text.index("Failed to activate") < text.index("fedmed register")
