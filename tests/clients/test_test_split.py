"""The held-out ``test`` split of every task, and sites that hold only evaluation data (issue 15).

Found: ``images.csv`` accepted a ``test`` split that nothing read; ``manifest.csv`` (PE)
and ``labels.csv`` (3D CT) refused one; a site folder without training items could not
be loaded; sites evaluated only on ``val``.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from clients.ct3d_cls import manifest as ct3d_manifest
from clients.ct3d_cls.task import CT3DClsTask
from clients.cxr_cls import manifest as cxr_manifest
from clients.cxr_cls.synthetic import generate_site as generate_cxr_site, site_profiles
from clients.cxr_cls.task import CXRClsTask
from clients.pe_seg import manifest as pe_manifest
from clients.pe_seg.task import PESegTask
from clients.site.decoded_cache import load_task
from clients.training.trainer import select_device
from clients.training.site_task import SiteDataError, TaskSettings
from tests.clients.small_sites import small_cxr_site

CPU = select_device("cpu")
CXR = TaskSettings(image_size=32, batch_size=4)


def _rows(task: str, site: Path) -> list:
    if task == "pe-seg":
        return [pe_manifest.ManifestRow(f"s{k}", split, site / f"s{k}", site / f"s{k}.nii.gz")
                for k, split in enumerate(("train", "val", "test"))]
    if task == "ct3d-cls":
        return [ct3d_manifest.ManifestRow(f"s{k}", split, site / f"s{k}.npy", k % 2)
                for k, split in enumerate(("train", "val", "test"))]
    return [cxr_manifest.ManifestRow(f"i{k}", split, site / f"i{k}.png", "1")
            for k, split in enumerate(("train", "val", "test"))]


@pytest.mark.parametrize("task, module", [("pe-seg", pe_manifest), ("ct3d-cls", ct3d_manifest),
                                          ("cxr-cls", cxr_manifest)])
def test_every_manifest_has_a_test_split(tmp_path: Path, task: str, module) -> None:
    site = tmp_path / "site"
    module.write_manifest(site, _rows(task, site))
    assert [row.split for row in module.read_manifest(site)] == ["train", "val", "test"]
    assert module.SPLITS == ("train", "val", "test")


def _relabel(site: Path, splits: dict[int, str], default: str) -> None:
    """Set the split of the images.csv rows by position (others get ``default``)."""
    rows = cxr_manifest.read_manifest(site)
    cxr_manifest.write_manifest(site, [dataclasses.replace(row, split=splits.get(k, default))
                                       for k, row in enumerate(rows)])


@pytest.fixture(scope="module")
def cxr_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 12-radiograph synthetic site (copied and relabelled by the tests)."""
    return small_cxr_site(tmp_path_factory.mktemp("cxr") / "hospital", 12, seed=3)


def _copy(source: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(source, tmp_path / "site"))


def test_the_cxr_task_loads_and_evaluates_the_test_split(cxr_source: Path, tmp_path: Path) -> None:
    site = _copy(cxr_source, tmp_path)
    _relabel(site, {8: "val", 9: "val", 10: "test", 11: "test"}, "train")
    task = CXRClsTask(site, CXR)
    assert (len(task.train_set), len(task.val_set), len(task.test_set)) == (8, 2, 2)
    torch.manual_seed(0)
    model = task.build_model()
    test = task.evaluate(model, CPU, split="test")
    assert test.num_examples == test.num_studies == 2 and "accuracy" in test.metrics
    assert task.evaluate(model, CPU) == task.evaluate(model, CPU, split="val")
    with pytest.raises(ValueError, match="evaluation split must be one of"):
        task.evaluate(model, CPU, split="train")


def test_a_test_only_site_loads_evaluates_and_refuses_training(cxr_source: Path,
                                                                 tmp_path: Path) -> None:
    site = _copy(cxr_source, tmp_path)
    _relabel(site, {}, "test")
    task = CXRClsTask(site, CXR)
    assert task.train_set is None and task.val_set is None and len(task.test_set) == 12
    model = task.build_model()
    for attempt in (lambda: task.train(model, steps=1, lr=1e-3, momentum=0.9, compute=CPU, seed=0),
                    lambda: task.training_loss(model, CPU)):
        with pytest.raises(SiteDataError, match=r"images\.csv: no training items"):
            attempt()
    val = task.evaluate(model, CPU, split="val")
    assert (val.num_examples, val.num_studies, val.metrics) == (0, 0, {})
    assert task.evaluate(model, CPU, split="test").num_examples == 12


def test_a_cached_task_keeps_its_test_split(cxr_source: Path, tmp_path: Path) -> None:
    site = _copy(cxr_source, tmp_path)
    _relabel(site, {0: "train", 1: "train", 2: "val"}, "test")
    built = load_task(CXRClsTask, site, CXR, tmp_path / "cache")
    cached = load_task(CXRClsTask, site, CXR, tmp_path / "cache")
    assert cached is not built and len(cached.test_set) == len(built.test_set) == 9
    assert all(torch.equal(a, b) for a, b in zip(cached.test_set.images, built.test_set.images))


def test_a_pe_site_of_test_studies_only(small_site: Path, tmp_path: Path) -> None:
    site = _copy(small_site, tmp_path)
    rows = pe_manifest.read_manifest(site)
    pe_manifest.write_manifest(site, [dataclasses.replace(row, split="test") for row in rows])
    task = PESegTask(site, TaskSettings(image_size=32, slab_slices=9, batch_size=4))
    assert task.train_set is None and task.val_set is None
    torch.manual_seed(0)
    model = task.build_model()
    with pytest.raises(SiteDataError, match=r"manifest\.csv: no training items"):
        task.train(model, steps=1, lr=0.01, momentum=0.9, compute=CPU, seed=0)
    test = task.evaluate(model, CPU, split="test")
    assert test.num_studies == len(rows) and set(test.metrics) == {"dice"}
    assert task.evaluate(model, CPU).num_examples == 0


def test_a_ct3d_site_with_a_test_split(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rows = []
    for k, split in enumerate(("train", "train", "val", "test", "test")):
        path = tmp_path / f"v{k}.npy"
        np.save(path, rng.random((8, 32, 32), dtype=np.float32))
        rows.append(ct3d_manifest.ManifestRow(f"v{k}", split, path, k % 2))
    ct3d_manifest.write_manifest(tmp_path, rows)
    task = CT3DClsTask(tmp_path, TaskSettings(image_size=32, volume_depth=8, batch_size=2))
    assert (len(task.train_set), len(task.val_set), len(task.test_set)) == (2, 1, 2)
    test = task.evaluate(task.build_model(), CPU, split="test")
    assert test.num_examples == 2 and "auc" in test.metrics


def _files(site: Path, rows: list) -> dict[str, bytes]:
    """Bytes of every file under the site folder that belongs to one of ``rows``."""
    out = {}
    for row in rows:
        image = Path(getattr(row, "image_path", None) or getattr(row, "image_dir", None) or row.image)
        for path in sorted(image.rglob("*")) if image.is_dir() else [image]:
            out[path.relative_to(site).as_posix()] = path.read_bytes()
    return out


def _generators(pe_profile):
    from clients.ct3d_cls.synthetic import SiteProfile as CT3DProfile, generate_site as ct3d
    from clients.pe_seg.synthetic import generate_site as pe

    cxr_profile = dataclasses.replace(site_profiles(1, 0)[0], num_images=6)
    ct3d_profile = CT3DProfile(name="tiny", num_studies=4, noise_hu=20.0, positive_rate=0.5,
                               dicom_fraction=0.5, image_size=16, num_slices=(4, 5),
                               slice_spacing_mm=(20.0, 24.0))
    return {"cxr-cls": (lambda d, **kw: generate_cxr_site(d, cxr_profile, 1, 32, **kw),
                        cxr_manifest, 4),
            "ct3d-cls": (lambda d, **kw: ct3d(d, ct3d_profile, 1, **kw), ct3d_manifest, 2),
            "pe-seg": (lambda d, **kw: pe(d, pe_profile, 1, 16, **kw), pe_manifest, 2)}


@pytest.mark.parametrize("task", ["cxr-cls", "ct3d-cls", "pe-seg"])
def test_the_generator_adds_a_test_split_and_keeps_train_and_val(tmp_path: Path, task: str,
                                                                 small_profile) -> None:
    generate, manifest, num_test = _generators(dataclasses.replace(
        small_profile, num_studies=3, num_slices=(9, 9)))[task]
    plain, with_test = generate(tmp_path / "plain", num_test=0), generate(tmp_path / "test")
    before, after = manifest.read_manifest(plain), manifest.read_manifest(with_test)
    assert [row.split for row in after] == [row.split for row in before] + ["test"] * num_test
    assert _files(plain, before) == _files(with_test, after[:len(before)])
