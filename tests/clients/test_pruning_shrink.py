"""Structured pruning for real (clients/training/pruning_surgery.py shrink, Shrunk.dense_state)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from clients.registry import task_class
from clients.training.pruning import PruningSurgeryError, model_cost, model_structure, shrink
from tests.clients.pruning_models import TINY, keep_fraction, masked_copy, tiny_model, unit_masks

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=sorted(TINY))
def quarter(request):
    """Each task's model, its structure, masks keeping 25% of every group's channels, the
    shrunk model."""
    model, x = tiny_model(request.param)
    structure = model_structure(model, "structured", x)
    masks = unit_masks(structure, model, keep_fraction(structure, 0.25))
    return model, x, structure, masks, shrink(model, structure, masks, x)


def test_dense_state_of_the_shrunk_model_is_the_masked_dense_model(quarter):
    model, _, _, masks, shrunk = quarter
    dense = shrunk.dense_state(shrunk.model.state_dict())
    expected = masked_copy(model, masks).state_dict()
    assert list(dense) == list(expected)
    params = dict(model.named_parameters())
    for name, value in dense.items():
        assert value.shape == tuple(expected[name].shape), name
        if name in params:
            np.testing.assert_array_equal(value, expected[name].numpy(), err_msg=name)
        else:  # buffers: the kept channels' values, 0 at removed ones
            kept = shrunk.kept_indices.get(name, {}).get(0)
            full = expected[name].numpy()
            np.testing.assert_array_equal(value if kept is None else value[kept],
                                          full if kept is None else full[kept], err_msg=name)


def test_the_shrunk_model_is_smaller_and_cheaper(quarter):
    model, x, _, _, shrunk = quarter
    dense, small = model_cost(model, x), model_cost(shrunk.model, x)
    assert small["params"] < dense["params"]
    assert small["flops"] < dense["flops"]
    assert small["params"] == sum(p.numel() for p in shrunk.model.parameters())


def test_the_shrunk_model_computes_the_masked_dense_model(quarter):
    model, x, _, masks, shrunk = quarter
    with torch.no_grad():
        torch.testing.assert_close(shrunk.model.eval()(x), masked_copy(model, masks).eval()(x),
                                   rtol=1e-5, atol=1e-5)


def test_training_the_shrunk_model_touches_no_pruned_coordinate(quarter):
    model, x, _, masks, shrunk = quarter
    small = shrunk.model.train()
    before = shrunk.dense_state(small.state_dict())
    opt = torch.optim.SGD(small.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        small(x).float().square().mean().backward()
        opt.step()
    after = shrunk.dense_state(small.state_dict())
    for name, mask in masks.items():
        assert np.all(after[name][~mask] == 0), name
    assert any(not np.array_equal(after[n], before[n]) for n in masks)


@pytest.mark.parametrize("task", sorted(TINY))
def test_dp_sgd_models_shrink_to_their_masked_function(task):
    """DP-SGD's models (GroupNorm for BatchNorm, slice-wise layers): groups through a GroupNorm
    are left out (a zeroed channel still counts in its group's statistics)."""
    _, x = tiny_model(task)
    model = task_class(task).model_for_run(TINY[task], private=True).eval()
    structure = model_structure(model, "structured", x)
    norms = {f"{n}.{k}" for n, m in model.named_modules() if isinstance(m, nn.GroupNorm)
             for k, _ in m.named_parameters(recurse=False)}
    assert not any(p["array"] in norms for g in structure["groups"] for p in g["slices"])
    masks = unit_masks(structure, model, keep_fraction(structure, 0.25))
    with torch.no_grad():
        torch.testing.assert_close(shrink(model, structure, masks, x).model.eval()(x),
                                   masked_copy(model, masks)(x), rtol=1e-5, atol=1e-5)


def test_shrink_refuses_an_unstructured_structure_and_a_foreign_layer():
    model, x = tiny_model("tabular-cls")
    with pytest.raises(PruningSurgeryError, match="structured"):
        shrink(model, model_structure(model, "unstructured", x), {}, x)
    structure = model_structure(model, "structured", x)
    foreign = {"mode": "structured", "groups": [{**structure["groups"][0], "name": "head.9"}]}
    with pytest.raises(PruningSurgeryError, match="'head.9'"):
        shrink(model, foreign, unit_masks(structure, model, {structure["groups"][0]["name"]: [0]}),
               x)


def test_dense_state_refuses_a_state_of_another_shape():
    model, x = tiny_model("tabular-cls")
    structure = model_structure(model, "structured", x)
    shrunk = shrink(model, structure, unit_masks(structure, model, keep_fraction(structure, 0.5)),
                    x)
    with pytest.raises(PruningSurgeryError, match="shape"):
        shrunk.dense_state(model.state_dict())
