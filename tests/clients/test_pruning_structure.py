"""The prunable structure of each task's model (clients/training/pruning.py model_structure)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from clients.training.pruning import PruningSurgeryError, model_structure, shrink
from tests.clients.pruning_models import TINY, masked_copy, tiny_model, unit_masks

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=sorted(TINY))
def task_structures(request):
    model, x = tiny_model(request.param)
    return (request.param, model, x, model_structure(model, "unstructured", x),
            model_structure(model, "structured", x))


def test_unstructured_groups_are_the_weight_matrices_in_state_dict_order(task_structures):
    _, model, _, unstructured, _ = task_structures
    params = dict(model.named_parameters())
    expected = [n for n in model.state_dict() if n in params and params[n].dim() >= 2]
    assert unstructured["mode"] == "unstructured"
    assert [g["name"] for g in unstructured["groups"]] == expected
    assert all(g["array"] == g["name"] for g in unstructured["groups"])


def test_structured_groups_are_valid_slices_of_trainable_parameters(task_structures):
    _, model, x, _, structure = task_structures
    params = dict(model.named_parameters())
    assert structure["mode"] == "structured" and structure["groups"]
    json.dumps(structure)  # JSON-able, as the numpy side reads it
    for group in structure["groups"]:
        units = {len(piece["indices"]) for piece in group["slices"]}
        assert len(units) == 1, group["name"]
        for piece in group["slices"]:
            assert piece["array"] in params, piece["array"]  # never a buffer
            size = params[piece["array"]].shape[piece["axis"]]
            assert all(0 <= i < size for i in piece["indices"])
            assert len(set(piece["indices"])) == len(piece["indices"])
    assert model_structure(model, "structured", x) == structure  # deterministic


def test_output_and_recurrent_layers_are_left_out(task_structures):
    task, model, _, _, structure = task_structures
    roots = {g["name"] for g in structure["groups"]}
    last = [name for name, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))][-1]
    assert last not in roots  # its output channels are the predictions
    if task == "ct3d-cls":  # the ConvLSTM cells' convolutions: gates and recurrence
        assert not any(".lstm." in name for name in roots)
        assert not any(".lstm." in p["array"] and p["axis"] == 0
                       for g in structure["groups"] for p in g["slices"])


def test_every_layer_but_the_outputs_is_pruned_in_a_feed_forward_model(task_structures):
    """Every convolution or linear layer's output channels are units, but those of the
    output layers (one output channel here) and the ConvLSTM's (recurrent)."""
    task, model, _, _, structure = task_structures
    cut = {(p["array"], p["axis"]) for g in structure["groups"] for p in g["slices"]}
    for name, m in model.named_modules():
        if isinstance(m, (nn.modules.conv._ConvNd, nn.Linear)) and ".lstm." not in name:
            outputs = m.out_channels if isinstance(m, nn.modules.conv._ConvNd) else m.out_features
            transposed = isinstance(m, nn.modules.conv._ConvTransposeNd)
            assert ((f"{name}.weight", int(transposed)) in cut) == (outputs > 1), name


def test_zeroing_one_unit_is_removing_its_channel(task_structures):
    """The coordinator's mask (coordinates of the unit zeroed) and the site's surgery
    (torch-pruning removes the channel) compute the same function."""
    _, model, x, _, structure = task_structures
    groups = structure["groups"]
    for group in {id(g): g for g in (groups[0], groups[len(groups) // 2], groups[-1])}.values():
        masks = unit_masks(structure, model, {group["name"]: [0]})
        small = shrink(model, structure, masks, x).model.eval()
        with torch.no_grad():
            torch.testing.assert_close(small(x), masked_copy(model, masks)(x),
                                       rtol=1e-5, atol=1e-5, msg=group["name"])


def test_an_unknown_mode_is_refused():
    model, x = tiny_model("tabular-cls")
    with pytest.raises(PruningSurgeryError, match="pruning.mode"):
        model_structure(model, "filters", x)
