"""The 3D CT classification task on a generated hospital."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from clients.ct3d_cls.task import CT3DClsTask
from clients.training.trainer import select_device
from clients.training.site_task import SiteDataError, TaskSettings

SETTINGS = TaskSettings(image_size=32, volume_depth=8, batch_size=2)


@pytest.fixture(scope="module")
def ct3d_site(synthetic_site) -> Path:
    return synthetic_site("ct3d-cls", seed=2)


def test_trains_and_reports_auc(ct3d_site: Path):
    torch.manual_seed(0)
    task = CT3DClsTask(ct3d_site, SETTINGS)
    assert task.report.skipped == {}
    x, y = task.train_set[0]
    assert tuple(x.shape) == (1, 8, 32, 32) and tuple(y.shape) == (1,)
    model = task.build_model()
    result = task.train(model, steps=2, lr=1e-3, momentum=0.9, compute=select_device("cpu"),
                        seed=0)
    assert result.steps_done == 2
    evaluation = task.evaluate(model, select_device("cpu"))
    assert set(evaluation.metrics) == {"accuracy", "auc"}
    assert CT3DClsTask.example_input(SETTINGS).shape == (1, 1, 8, 32, 32)


def test_site_without_volumes_is_an_error(tmp_path: Path):
    (tmp_path / "labels.csv").write_text("study_id,split,image,label\nx,train,missing.nii.gz,1\n")
    with pytest.raises(SiteDataError, match=r"labels\.csv: no usable volume in any split \(1 skipped\)"):
        CT3DClsTask(tmp_path, SETTINGS)
