"""The site's own view of its data, for the hospital's console: items and studies per split,
skipped items.

When a task loads a site's data (:class:`clients.site.site_round.SiteTasks`), the
counts of each split and every skipped item with its reason
(:class:`~clients.manifests.load_report.LoadReport`) are written to
``<state-dir>/data-report/<dataset-id>.json`` (atomically; ``dataset-id`` as the
privacy ledger's, :func:`~clients.site.privacy_ledger.dataset_id`)::

    {"task": "cxr-cls", "dataset": "3f2a...", "time": "2026-11-27T10:00:00Z",
     "splits": {"train": {"loaded": 289, "studies": 8}, "val": {"loaded": 30, "studies": 1},
                "test": {"loaded": 0, "studies": 0}},
     "skipped": {"study-0042": "unreadable DICOM series ..."}}

The reasons may name files and item ids: the file stays at the site (the
console serves its Data page to the local machine only); nothing of it is sent.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from clients.site.atomic_file import write_atomic
from clients.site.privacy_ledger import dataset_id
from clients.training.site_task import SiteTask

__all__ = ["DATA_REPORT_DIR", "data_report", "write_data_report"]

#: The folder of the data reports under the site's state dir.
DATA_REPORT_DIR = "data-report"


def data_report(task: SiteTask, data_path: str | Path) -> dict[str, Any]:
    """The report of ``task``'s loaded data (see the module docstring)."""
    splits = {}
    studies_of = getattr(task, "split_studies", None)
    for name in ("train", "val", "test"):  # a split the task never set has no items
        data = getattr(task, f"{name}_set", None)
        loaded = 0 if data is None else len(data)
        # items are the task's examples (a PE study is many slabs): the studies beside them
        splits[name] = {"loaded": loaded, "studies": loaded if data is None or studies_of is
                        None else int(studies_of(name))}
    report = getattr(task, "report", None)
    return {"task": task.name, "dataset": dataset_id(data_path),
            "time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "splits": splits, "skipped": dict(getattr(report, "skipped", {}))}


def write_data_report(task: SiteTask, data_path: str | Path, state_dir: str | Path) -> Path:
    """Write ``task``'s report under ``state_dir``; returns its path."""
    report = data_report(task, data_path)
    path = Path(state_dir) / DATA_REPORT_DIR / f"{report['dataset']}.json"
    return write_atomic(path, lambda handle: handle.write(
        json.dumps(report, indent=1, sort_keys=True).encode()))
