"""The site's decoded-data cache: reused while nothing changes, rebuilt when anything does."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
import torch

from clients.cxr_cls.task import CXRClsTask
from clients.site.decoded_cache import KEEP_PER_TASK, load_task
from clients.training.site_task import SiteDataError, TaskSettings
from clients.cxr_cls.synthetic import generate_federation

SETTINGS = TaskSettings(image_size=32, batch_size=8)


@pytest.fixture()
def site(tmp_path_factory, tmp_path) -> Path:
    root = tmp_path_factory.getbasetemp() / "decoded-cache-source"
    if not root.exists():
        generate_federation(root, num_sites=1, seed=3, image_size=48)
    copy = tmp_path / "hospital-00"
    shutil.copytree(root / "hospital-00", copy)
    return copy


def _forbid_building(monkeypatch) -> None:
    def refuse(self, site_dir, settings):
        raise AssertionError("the task was decoded again instead of read from the cache")
    monkeypatch.setattr(CXRClsTask, "__init__", refuse)


def test_second_load_comes_from_the_cache_with_the_same_tensors(site, monkeypatch):
    cache = site / ".fedmed-state" / "decoded-cache"
    built = load_task(CXRClsTask, site, SETTINGS, cache, exclude=[site / ".fedmed-state"])
    assert len(list(cache.glob("cxr-cls-*.pkl"))) == 1
    _forbid_building(monkeypatch)
    cached = load_task(CXRClsTask, site, SETTINGS, cache, exclude=[site / ".fedmed-state"])
    assert len(cached.train_set) == len(built.train_set) > 0
    for (x1, y1), (x2, y2) in zip(built.train_set, cached.train_set):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert cached.report.loaded == built.report.loaded
    # Site state written during the federation does not invalidate the cache.
    (site / ".fedmed-state" / "run-1").mkdir()
    (site / ".fedmed-state" / "run-1" / "ef-residual.npy").write_bytes(b"x")
    load_task(CXRClsTask, site, SETTINGS, cache, exclude=[site / ".fedmed-state"])


def test_changed_file_or_settings_rebuild(site, tmp_path):
    cache = tmp_path / "cache"
    first = load_task(CXRClsTask, site, SETTINGS, cache)
    image = sorted((site / "images").iterdir())[0]
    stat = image.stat()
    os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10_000_000_000))
    load_task(CXRClsTask, site, SETTINGS, cache)
    load_task(CXRClsTask, site, TaskSettings(image_size=16, batch_size=8), cache)
    files = list(cache.glob("cxr-cls-*.pkl"))
    assert len(files) == KEEP_PER_TASK == 3
    resized = load_task(CXRClsTask, site, TaskSettings(image_size=16, batch_size=8), cache)
    assert resized.train_set[0][0].shape[-1] == 16 != first.train_set[0][0].shape[-1]
    for _ in range(2):  # older files beyond KEEP_PER_TASK are pruned
        stat = image.stat()
        os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10_000_000_000))
        load_task(CXRClsTask, site, SETTINGS, cache)
    assert len(list(cache.glob("cxr-cls-*.pkl"))) == KEEP_PER_TASK


def test_corrupt_cache_is_logged_and_rebuilt(site, tmp_path, caplog):
    cache = tmp_path / "cache"
    load_task(CXRClsTask, site, SETTINGS, cache)
    (path,) = cache.glob("*.pkl")
    path.write_bytes(b"not a pickle")
    with caplog.at_level(logging.WARNING, logger="clients.site.decoded_cache"):
        task = load_task(CXRClsTask, site, SETTINGS, cache)
    assert "unreadable" in caplog.text and len(task.train_set) > 0
    assert path.stat().st_size > 100  # rewritten


def test_failed_builds_are_not_cached_and_none_disables(tmp_path):
    empty = tmp_path / "empty-site"
    empty.mkdir()
    (empty / "images.csv").write_text("image_id,split,image,labels\n")
    cache = tmp_path / "cache"
    with pytest.raises(SiteDataError):
        load_task(CXRClsTask, empty, SETTINGS, cache)
    assert not list(cache.glob("*.pkl"))
    with pytest.raises(SiteDataError):
        load_task(CXRClsTask, empty, SETTINGS, None)
