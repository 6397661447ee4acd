"""``initial-model``: the ServerApp's first global model comes from a pre-trained source
(issue 15, item 3; the source itself is read and checked by app.model_source)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.model_source import ModelSourceError
from app.server_app import initial_arrays
from clients.registry import task_class
from clients.training.site_task import TaskSettings

TINY = TaskSettings(image_size=16)


def test_the_first_global_model_is_the_initial_models_weights(tmp_path):
    task = task_class("pe-seg")
    pretrained = task.model_for_run(TINY)
    with torch.no_grad():
        for parameter in pretrained.parameters():
            parameter.fill_(0.25)
    torch.save(pretrained.state_dict(), tmp_path / "pretrained.pt")
    model = task.model_for_run(TINY)
    arrays = initial_arrays(model, str(tmp_path / "pretrained.pt"))
    expected = [v.numpy() for v in pretrained.state_dict().values()]
    assert list(arrays.keys()) == list(pretrained.state_dict())
    assert all(np.array_equal(a, b) for a, b in zip(arrays.to_numpy_ndarrays(), expected))
    assert all(torch.all(p == 0.25) for p in model.parameters())


def test_without_an_initial_model_the_weights_are_the_fresh_models():
    model = task_class("pe-seg").model_for_run(TINY)
    fresh = [v.numpy().copy() for v in model.state_dict().values()]
    arrays = initial_arrays(model, "")
    assert all(np.array_equal(a, b) for a, b in zip(arrays.to_numpy_ndarrays(), fresh))


def test_an_initial_model_of_another_network_is_refused(tmp_path):
    other = task_class("pe-seg").model_for_run(TaskSettings(image_size=16, slab_slices=3))
    torch.save(other.state_dict(), tmp_path / "three-slices.pt")
    with pytest.raises(ModelSourceError, match="three-slices.pt"):
        initial_arrays(task_class("pe-seg").model_for_run(TINY), str(tmp_path / "three-slices.pt"))
