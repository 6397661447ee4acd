"""The imaging tasks a site can run, by name (the run config's ``task``): one registry line per task.

:data:`TASKS` is a :class:`~strategies.wire.registry.Registry` of :class:`TaskEntry`
records, each naming as dotted paths, imported only on use, the task's
:class:`~clients.training.site_task.SiteTask` class, its synthetic hospital
generator and its shared-set converter, and listing the names of its real
shared sets (the first is the default ``SET``). Importing this module is
cheap (no numpy, no torch, no imaging library): the Makefile and ``python -m
clients.datagen`` ask it which generator and which sets a task has.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from strategies.wire.errors import ConfigError
from strategies.wire.registry import Registry, import_path

if TYPE_CHECKING:
    from clients.datagen.shared_set import SharedSet
    from clients.training.site_task import SiteTask

__all__ = ["TaskEntry", "TASKS", "task_class", "synthetic_module", "shared_set"]


@dataclass(frozen=True)
class TaskEntry:
    """Where a task's pieces live."""

    #: ``module:Class`` of its :class:`~clients.training.site_task.SiteTask`.
    task: str
    #: Module of its synthetic generator (``generate_federation``, ``main``).
    synthetic: str
    #: Module of its shared-set conversion (``SETS``, a Registry of its SharedSets by name).
    shared: str
    #: Names of its shared sets; the first is the default.
    shared_sets: tuple[str, ...]
    #: The :class:`~clients.training.task_settings.TaskSettings` fields whose product is the
    #: number of float32 values of one decoded example (the site policy's
    #: ``max-study-bytes`` bounds 4 bytes each, before any data is read); none for a task
    #: whose example is a table row (a few dozen values: counted as one, 4 bytes).
    study_dims: tuple[str, ...] = ("image_size", "image_size")
    #: Whether run-config ``augmentation`` applies (its training images are 2D or 3D images of
    #: a :class:`~clients.training.classification.ClassificationTask`).
    augmentable: bool = False

    def default_set(self, task: str) -> str:
        """The shared set used when none is named.

        Raises
        ------
        ConfigError
            When the task (named ``task``) has no shared set at all.
        """
        if not self.shared_sets:
            raise ConfigError(f"task {task!r} has no shared real set (clients/registry.py); "
                              "use its synthetic hospitals (DATA=synthetic)")
        return self.shared_sets[0]


#: Every task by name; a new task is its package under ``clients/`` and one line here.
TASKS: Registry[TaskEntry] = Registry("task", "task")
TASKS.add("pe-seg", TaskEntry("clients.pe_seg.task:PESegTask", "clients.pe_seg.synthetic",
                              "clients.pe_seg.shared", ("ctpa", "msd-lung"),
                              ("slab_slices", "image_size", "image_size")))
TASKS.add("cxr-cls", TaskEntry("clients.cxr_cls.task:CXRClsTask", "clients.cxr_cls.synthetic",
                               "clients.cxr_cls.shared", ("pneumoniamnist",), augmentable=True))
TASKS.add("ct3d-cls", TaskEntry("clients.ct3d_cls.task:CT3DClsTask", "clients.ct3d_cls.synthetic",
                                "clients.ct3d_cls.shared", ("adrenalmnist3d",),
                                ("volume_depth", "image_size", "image_size"), augmentable=True))
TASKS.add("tabular-cls", TaskEntry("clients.tabular.task:TabularClsTask", "clients.tabular.synthetic",
                                   "clients.tabular.shared", ("heart-disease",), ()))


def task_class(name: str) -> type[SiteTask]:
    """The task class for ``name`` (imports torch and the task's network).

    Raises
    ------
    ConfigError
        For an unknown task, listing the known ones.
    """
    return import_path(TASKS.get(name).task)


def synthetic_module(name: str) -> ModuleType:
    """The synthetic generator module of task ``name``."""
    return importlib.import_module(TASKS.get(name).synthetic)


def shared_set(task: str, name: str | None = None) -> SharedSet:
    """The shared set ``name`` of ``task`` (its default set when ``None``).

    Raises
    ------
    ConfigError
        For an unknown task, or a set the task does not have (listing its sets).
    """
    entry = TASKS.get(task)
    name = name or entry.default_set(task)
    if name not in entry.shared_sets:
        raise ConfigError(f"unknown set {name!r} for task {task!r}; expected one of {', '.join(entry.shared_sets)}")
    return importlib.import_module(entry.shared).SETS.get(name)
