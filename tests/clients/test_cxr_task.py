"""The chest X-ray classification task on a generated hospital."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from clients.cxr_cls.task import CXRClsTask
from clients.training.trainer import select_device
from clients.training.site_task import SiteDataError, TaskSettings
from clients.registry import task_class

SETTINGS = TaskSettings(image_size=32, batch_size=8)


@pytest.fixture(scope="module")
def cxr_site(synthetic_site) -> Path:
    return synthetic_site("cxr-cls", seed=5)


def test_trains_and_reports_auc(cxr_site: Path):
    torch.manual_seed(0)
    task = task_class("cxr-cls")(cxr_site, SETTINGS)
    assert isinstance(task, CXRClsTask) and task.report.skipped == {}
    model = task.build_model()
    result = task.train(model, steps=3, lr=1e-3, momentum=0.9, compute=select_device("cpu"),
                        seed=0)
    assert result.steps_done == 3 and result.num_examples == 24
    evaluation = task.evaluate(model, select_device("cpu"))
    assert set(evaluation.metrics) == {"accuracy", "auc"}
    assert 0.0 <= evaluation.metrics["auc"] <= 1.0
    assert evaluation.num_examples == len(task.val_set)
    assert task.training_loss(model, select_device("cpu"), subset=4) > 0
    assert CXRClsTask.example_input(SETTINGS).shape == (1, 1, 32, 32)


def test_balanced_sampling_reaches_the_positive_share(cxr_site: Path):
    task = CXRClsTask(cxr_site, TaskSettings(image_size=32, batch_size=8,
                                             positive_fraction=0.5))
    labels = torch.cat([y for _, y in task._train_loader(1, select_device("cpu"))])  # noqa: SLF001
    assert 0.3 < float(labels.mean()) < 0.7


def test_site_without_images_is_an_error(tmp_path: Path):
    (tmp_path / "images.csv").write_text("image_id,split,image,labels\n")
    with pytest.raises(SiteDataError, match=r"images\.csv: no usable radiograph in any split"):
        CXRClsTask(tmp_path, SETTINGS)
