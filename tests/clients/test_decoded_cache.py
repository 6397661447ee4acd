"""The site's decoded-data cache: reused while nothing changes, rebuilt when anything does."""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from clients.cxr_cls.task import CXRClsTask
from clients.registry import task_class
from clients.site.decoded_cache import (
    KEEP_PER_TASK,
    cache_key,
    decode_task,
    encode_task,
    load_task,
)
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
    assert len(list(cache.glob("cxr-cls-*.npz"))) == 1
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
    files = list(cache.glob("cxr-cls-*.npz"))
    assert len(files) == KEEP_PER_TASK == 3
    resized = load_task(CXRClsTask, site, TaskSettings(image_size=16, batch_size=8), cache)
    assert resized.train_set[0][0].shape[-1] == 16 != first.train_set[0][0].shape[-1]
    for _ in range(2):  # older files beyond KEEP_PER_TASK are pruned
        stat = image.stat()
        os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10_000_000_000))
        load_task(CXRClsTask, site, SETTINGS, cache)
    assert len(list(cache.glob("cxr-cls-*.npz"))) == KEEP_PER_TASK


def test_corrupt_cache_is_logged_and_rebuilt(site, tmp_path, caplog):
    cache = tmp_path / "cache"
    load_task(CXRClsTask, site, SETTINGS, cache)
    (path,) = cache.glob("*.npz")
    path.write_bytes(b"not an npz file")
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
    assert not list(cache.glob("*.npz"))
    with pytest.raises(SiteDataError):
        load_task(CXRClsTask, empty, SETTINGS, None)


def test_a_planted_pickle_never_runs(site, tmp_path, caplog):
    """Found: the decoded cache was unpickled before any check (write access = code execution)."""
    cache = tmp_path / "cache"
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    key = cache_key(CXRClsTask, site, SETTINGS, [cache])
    cache.mkdir(mode=0o700)
    for suffix in ("pkl", "npz"):
        (cache / f"cxr-cls-{key}.{suffix}").write_bytes(pickle.dumps(Payload()))
    with caplog.at_level(logging.WARNING, logger="clients.site.decoded_cache"):
        task = load_task(CXRClsTask, site, SETTINGS, cache)
    assert not marker.exists()
    assert "unreadable" in caplog.text and len(task.train_set) > 0
    assert not list(cache.glob("*.pkl"))  # old pickles are removed, never read


def test_cache_folder_is_private_and_an_open_one_is_not_used(site, tmp_path, caplog, monkeypatch):
    cache = tmp_path / "state" / "decoded-cache"
    load_task(CXRClsTask, site, SETTINGS, cache)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    os.chmod(cache, 0o777)  # anyone could plant a file here
    built = []
    original = CXRClsTask.__init__

    def counting(self, site_dir, settings):
        built.append(site_dir)
        original(self, site_dir, settings)

    monkeypatch.setattr(CXRClsTask, "__init__", counting)
    with caplog.at_level(logging.WARNING, logger="clients.site.decoded_cache"):
        load_task(CXRClsTask, site, SETTINGS, cache)
    assert built and "mode 0700" in caplog.text


def test_the_cache_builds_only_classes_of_the_clients_package():
    tree, arrays = encode_task({"p": Path("/x"), "t": (1, np.int64(2)), "a": torch.ones(2)})
    value = decode_task(tree, arrays)
    assert value["p"] == Path("/x") and value["t"] == (1, 2) and torch.equal(value["a"],
                                                                            torch.ones(2))
    for name in ("os:system", "builtins:eval", "clients.not_loaded_module:X"):
        with pytest.raises(TypeError, match="not of the loaded clients package"):
            decode_task({"t": "object", "type": name, "v": {}}, {})


@pytest.mark.parametrize("task", ["pe-seg", "ct3d-cls"])
def test_every_task_round_trips_through_the_cache(synthetic_site, tmp_path, task):
    site = synthetic_site(task, seed=1, image_size=32)
    task_cls = task_class(task)
    settings = TaskSettings(image_size=32, batch_size=2, volume_depth=8)
    built = load_task(task_cls, site, settings, tmp_path / "cache")
    cached = load_task(task_cls, site, settings, tmp_path / "cache")
    assert type(cached) is task_cls and cached is not built
    assert len(cached.train_set) == len(built.train_set) > 0
    for (x1, y1), (x2, y2) in zip(built.train_set, cached.train_set):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert cached.report == built.report
