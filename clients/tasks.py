"""The imaging tasks a site can run, by name (the run config's ``task``)."""

from __future__ import annotations

from clients.ct3d_task import CT3DClsTask
from clients.cxr_task import CXRClsTask
from clients.pe_seg_task import PESegTask
from clients.site_task import SiteTask

__all__ = ["TASKS", "task_class"]

TASKS: dict[str, type[SiteTask]] = {
    task.name: task for task in (PESegTask, CXRClsTask, CT3DClsTask)}


def task_class(name: str) -> type[SiteTask]:
    """The task class for ``name``.

    Raises
    ------
    ValueError
        For an unknown task, listing the known ones.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {sorted(TASKS)}")
    return TASKS[name]
