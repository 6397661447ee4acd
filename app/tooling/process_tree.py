"""Process trees on Linux: descendants, start times, bounded stops by PID.

Flower starts helper processes in their own sessions (``flower-superexec``,
ServerApp / ClientApp processes, Ray workers), so stopping a daemon's process
group is not enough: its descendants are found through ``/proc`` and stopped by
PID too. A PID is signalled only while its start time is unchanged, so a reused
PID is never hit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

__all__ = ["start_time", "descendants", "stop_pids", "stop_process_group"]


def start_time(pid: int) -> str | None:
    """Start time of ``pid`` (field 22 of /proc/pid/stat), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, start time) of every live descendant of ``pid`` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        started = start_time(child)
        if started is not None:
            found.append((child, started))
        todo.extend(children.get(child, []))
    return found


def stop_pids(pids: Iterable[tuple[int, str]], timeout: float) -> None:
    """Wait for these processes to exit, then SIGTERM / SIGKILL the ones left.

    A PID is only signalled while its start time is unchanged (no PID reuse).
    """
    alive = list(pids)
    for sig, wait in ((None, timeout), (signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        alive = [(p, s) for p, s in alive if start_time(p) == s]
        for pid, _ in alive:
            if sig is not None:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + wait
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = [(p, s) for p, s in alive if start_time(p) == s]
        if not alive:
            return


def stop_process_group(process: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM the process group, then SIGKILL it after ``timeout`` seconds."""
    if process.poll() is not None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=timeout)
