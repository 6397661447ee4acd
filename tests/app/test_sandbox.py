"""The worker's sandbox command: fail closed without bubblewrap, mounts in a working order.

What the sandboxed worker can and cannot reach is played by the malicious-app suite
(tests/app/test_malicious_app.py); these are the command's own rules.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from app.site_runtime import sandbox
from app.site_runtime.sandbox import (SandboxLimits, SandboxUnavailable, WorkerMounts,
                                      sandboxed_command)
from app.tooling.errors import FlowerProcessError


def _mounts(tmp_path: Path) -> WorkerMounts:
    data = tmp_path / "site"
    state = data / ".fedmed-state"
    return WorkerMounts(data, state, state / "worker", tmp_path / "home" / "apps" / "app",
                        tmp_path / "home", state / "runtime" / "worker-policy.toml",
                        Path(sandbox.__file__).with_name("site_worker.py"))


def test_without_bubblewrap_no_worker_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        sandboxed_command([sys.executable], _mounts(tmp_path), SandboxLimits(), {})


def test_the_mounts_come_in_an_order_that_keeps_them(tmp_path, monkeypatch):
    """Found while running the walkthrough: a virtual environment under /tmp was bound
    before the sandbox's fresh /tmp, which then hid it (the worker could not start)."""
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "repo" / ".venv"))  # the walkthrough's
    command = sandboxed_command([sys.executable], _mounts(tmp_path), SandboxLimits(),
                                {"OMP_NUM_THREADS": "1", "AWS_SECRET_ACCESS_KEY": "x"})
    tmpfs = command.index("/tmp", command.index("--tmpfs") - 2)
    binds = [i for i, arg in enumerate(command) if arg in ("--bind", "--ro-bind")]
    under_tmp = [i for i in binds if command[i + 2].startswith("/tmp/")]
    assert str(tmp_path / "repo" / ".venv") in [command[i + 2] for i in under_tmp]
    assert all(i > tmpfs for i in under_tmp)
    state = str(tmp_path / "site" / ".fedmed-state")
    assert command.index(state) < command.index(f"{state}/worker")  # hidden, then its part
    assert "--unshare-net" in command and "--clearenv" in command
    assert "OMP_NUM_THREADS" in command and "AWS_SECRET_ACCESS_KEY" not in command


@pytest.mark.parametrize("limits", [dict(max_processes=4), dict(max_memory=-1),
                                    dict(worker_uid=0)])
def test_limits_are_checked_naming_what_is_wrong(limits):
    with pytest.raises(FlowerProcessError):
        SandboxLimits(**limits)


def test_dependencies_a_pth_file_adds_are_mounted_with_what_their_links_point_to(tmp_path,
                                                                                monkeypatch):
    """A venv whose dependencies come from a ``.pth`` folder of links (the wheel test's
    venv) or ``PYTHONPATH``: the worker sees that folder and the links' targets, never a
    folder of the product's own packages nor the working folder."""
    real, deps, ours, here = (tmp_path / n for n in ("real", "deps", "checkout", "here"))
    (real / "torch").mkdir(parents=True)
    deps.mkdir()
    (deps / "torch").symlink_to(real / "torch")
    (ours / "app").mkdir(parents=True)
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(map(str, (deps, ours, here))))
    assert sandbox._dependency_folders() == sorted([deps, real])
    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    (site_dir / "deps.pth").write_text(f"# a comment\nimport os\n{deps}\n")
    monkeypatch.setenv("PYTHONPATH", "")
    monkeypatch.setattr(sandbox.site, "getsitepackages", lambda: [str(site_dir)])
    assert sandbox._dependency_folders() == sorted([deps, real])
