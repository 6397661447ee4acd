"""The PE task on a generated hospital: loading, training, validation Dice, bad sites."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from clients.training.trainer import select_device
from clients.pe_seg.task import PESegTask
from clients.training.site_task import SiteDataError, TaskSettings, make_optimizer

SETTINGS = TaskSettings(image_size=32, slab_slices=9, batch_size=4)


def test_trains_and_evaluates_a_generated_site(small_site: Path):
    task = PESegTask(small_site, SETTINGS)
    assert task.report.skipped == {}
    torch.manual_seed(0)
    model = task.build_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = task.train(model, steps=3, lr=0.01, momentum=0.9, compute=select_device("cpu"),
                        seed=1, optimizer="sgd")
    assert result.steps_done == 3 and result.num_examples == 12
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed
    evaluation = task.evaluate(model, select_device("cpu"))
    assert evaluation.num_examples == len(task.val_set)
    assert evaluation.num_studies == len(task.val_set.study_ids) >= 1
    assert 0.0 <= evaluation.metrics["dice"] <= 1.0


def test_training_sampler_oversamples_slices_with_emboli(small_site: Path):
    task = PESegTask(small_site, SETTINGS)
    loader = task._train_loader(0, select_device("cpu"))  # noqa: SLF001 - the sampler is the point here
    targets = torch.cat([y for _, y in loader])
    share = (targets.flatten(1).amax(1) > 0).float().mean().item()
    natural = task.train_set.num_positive_slices / len(task.train_set)
    assert share > natural or natural > 0.45


def test_site_with_one_broken_study_trains_on_the_rest(small_site: Path, tmp_path: Path):
    site = tmp_path / "site"
    shutil.copytree(small_site, site)
    manifest = (site / "manifest.csv").read_text().splitlines()
    train_rows = [row for row in manifest[1:] if ",train," in row]
    broken = train_rows[0].split(",")[3]
    (site / broken).write_bytes(b"not a nifti file")
    task = PESegTask(site, SETTINGS)
    assert len(task.report.skipped) == 1
    assert broken.split("/")[1] in task.report.skipped


def test_site_without_training_studies_loads_but_cannot_train(small_site: Path, tmp_path: Path):
    site = tmp_path / "site"
    shutil.copytree(small_site, site)
    lines = (site / "manifest.csv").read_text().splitlines()
    (site / "manifest.csv").write_text("\n".join([lines[0]] + [
        line for line in lines[1:] if ",val," in line]) + "\n")
    task = PESegTask(site, SETTINGS)
    assert task.train_set is None and len(task.val_set.study_ids) >= 1
    with pytest.raises(SiteDataError, match=r"manifest\.csv: no training items"):
        task.training_loss(task.build_model(), select_device("cpu"))


def test_site_without_any_usable_study_is_an_error(tmp_path: Path):
    (tmp_path / "manifest.csv").write_text("study_id,split,image,mask\nx,test,missing,missing.nii.gz\n")
    with pytest.raises(SiteDataError, match=r"manifest\.csv: no usable study in any split \(1 skipped\)"):
        PESegTask(tmp_path, SETTINGS)


def test_unknown_optimizer():
    with pytest.raises(ValueError, match="'optimizer' must be one of"):
        make_optimizer("rmsprop", [torch.zeros(1, requires_grad=True)], 0.1, 0.9)
