"""What ``make predict`` runs over: a site folder's manifest, or a plain folder of studies / images.

A **site folder** holds the task's manifest (its ``manifest_name``, docs/DATA.md):
its rows are the items, with their split and, where present, their reference
(a mask, labels), so the task's metric can be computed
(:meth:`~clients.training.site_task.SiteTask.manifest_items`). A **plain
folder** is what a PACS export gives: the task says which of its files and
folders are items (:meth:`~clients.training.site_task.SiteTask.folder_items`).
A folder holding another task's manifest is refused, naming both tasks.
Nothing is read here beyond the manifest: an unreadable item is skipped later,
when it is predicted.
"""

from __future__ import annotations

from pathlib import Path

from clients.manifests.csv_rows import SPLITS
from clients.prediction.items import PredictionItem
from clients.registry import TASKS, task_class
from clients.training.site_task import SiteTask, TaskSettings
from strategies.wire.errors import ConfigError

__all__ = ["discover_items"]


def discover_items(task: type[SiteTask], data: Path, split: str | None,
                   settings: TaskSettings) -> list[PredictionItem]:
    """The items of ``data`` for ``task``: its manifest's rows (of ``split``), or a plain folder's items.

    Raises
    ------
    ConfigError
        If ``data`` is not a folder, holds another task's manifest, or ``split``
        is given for a plain folder or is not one of the manifest's splits.
    ManifestError
        If the site's manifest is malformed.
    """
    if not data.is_dir():
        raise ConfigError(f"DATA {data}: not a folder (a site folder or a folder of studies/images)")
    name = task.manifest_name
    if (data / name).is_file():
        if split is not None and split not in SPLITS:
            raise ConfigError(f"--split {split}: {task.name} manifests have the splits {SPLITS}")
        return task.manifest_items(data, split, settings)
    for other in TASKS:
        other_name = task_class(other).manifest_name
        if other_name != name and (data / other_name).is_file():
            raise ConfigError(f"DATA {data}: holds {other_name}, a {other} site, but the model is "
                              f"for {task.name} (expects {name})")
    if split is not None:
        raise ConfigError(f"--split {split}: DATA {data} has no {name} (a plain folder has no splits)")
    return task.folder_items(data)
