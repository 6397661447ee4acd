"""A site's loaded tasks and compute device: read once per process, used by every round.

A new process (in deployment: every message) takes the decoded data from the
site's disk cache under ``state-dir`` unless the site says ``cache-decoded =
false`` (:mod:`clients.site.decoded_cache`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from clients.registry import task_class
from clients.site.decoded_cache import CACHE_DIR_NAME, load_task
from clients.site.site import Site
from clients.training.device import ComputeDevice, select_device
from clients.training.site_task import SiteTask, TaskSettings

__all__ = ["SiteTasks", "TaskLoader"]

#: ``load(task_class, site_dir, settings, cache_dir, exclude=[...]) -> SiteTask``.
TaskLoader = Callable[..., SiteTask]


class SiteTasks:
    """The tasks a process has loaded, by (task, site folder, settings), and its device.

    Parameters
    ----------
    load : callable
        How a task is loaded (:func:`clients.site.decoded_cache.load_task`; a test
        passes a fake).
    compute : ComputeDevice or None
        The device; ``None``: :func:`~clients.training.device.select_device` on first use.
    """

    def __init__(self, load: TaskLoader = load_task, compute: ComputeDevice | None = None
                 ) -> None:
        self._load = load
        self._compute = compute
        self._tasks: dict[tuple[str, str, TaskSettings], SiteTask] = {}

    def task(self, site: Site, name: str, settings: TaskSettings) -> SiteTask:
        """Task ``name`` at ``site`` with ``settings``, loaded on first use."""
        key = (name, str(site.data_path), settings)
        if key not in self._tasks:
            cache_dir: Path | None = site.state_dir / CACHE_DIR_NAME if site.cache_decoded else None
            self._tasks[key] = self._load(task_class(name), site.data_path, settings, cache_dir,
                                          exclude=[site.state_dir])
        return self._tasks[key]

    def compute(self) -> ComputeDevice:
        """The process's compute device."""
        if self._compute is None:
            self._compute = select_device()
        return self._compute

    def loaded(self) -> list[SiteTask]:
        """The tasks loaded so far."""
        return list(self._tasks.values())

    def clear(self) -> None:
        """Forget the loaded tasks (a restarted process)."""
        self._tasks.clear()
