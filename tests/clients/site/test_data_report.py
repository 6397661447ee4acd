"""A site's data report: written when its task loads, items per split and skipped items with
their reasons, kept in its state dir for the console's Data page (never sent)."""

from __future__ import annotations

import json

from clients.site.data_report import DATA_REPORT_DIR
from clients.site.privacy_ledger import dataset_id
from clients.site.site_round import SiteTasks
from tests.clients.site_round_fixtures import SIZES, TinyCxr, site


def test_loading_a_task_writes_its_data_report(tmp_path):
    task = TinyCxr()
    task.report.skipped = {"study-7": "series has no pixel data"}
    here = site(tmp_path)
    tasks = SiteTasks(lambda *a, **k: task)
    assert tasks.task(here, "cxr-cls", SIZES) is task
    path = here.state_dir / DATA_REPORT_DIR / f"{dataset_id(here.data_path)}.json"
    report = json.loads(path.read_text())
    assert report["task"] == "cxr-cls" and report["dataset"] == dataset_id(here.data_path)
    assert report["splits"] == {"train": {"loaded": 12, "studies": 12},
                                "val": {"loaded": 4, "studies": 4},
                                "test": {"loaded": 0, "studies": 0}}
    assert report["skipped"] == {"study-7": "series has no pixel data"}


def test_a_task_without_a_split_or_report_writes_what_it_has(tmp_path):
    task = TinyCxr()
    del task.val_set, task.report  # a task class that never set them (as some test fakes)
    here = site(tmp_path)
    SiteTasks(lambda *a, **k: task).task(here, "cxr-cls", SIZES)
    path = here.state_dir / DATA_REPORT_DIR / f"{dataset_id(here.data_path)}.json"
    report = json.loads(path.read_text())
    assert report["splits"]["val"] == {"loaded": 0, "studies": 0} and report["skipped"] == {}


def test_a_task_of_slabs_reports_its_studies_beside_them(tmp_path):
    """Issue 47, walkthrough 9: the console counted 289 "train" for 8 PE studies (slabs)."""
    task = TinyCxr()
    task.split_studies = lambda split: {"train": 3, "val": 1, "test": 0}[split]
    here = site(tmp_path)
    SiteTasks(lambda *a, **k: task).task(here, "cxr-cls", SIZES)
    path = here.state_dir / DATA_REPORT_DIR / f"{dataset_id(here.data_path)}.json"
    assert json.loads(path.read_text())["splits"]["train"] == {"loaded": 12, "studies": 3}
