"""The site's side of adaptive pruning: the mask it holds, its squared-gradient report, its refusal
of a structural change to layers it keeps (clients/site/site_pruning.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from clients.site.site_pruning import (MaskVersionError, PrunedTraining, StructuralChangeRefused,
                                       evaluated_network, received_mask,
                                       refuse_structural_change, squared_gradient_report)
from clients.training.personalisation.methods.fedbn import FedBN
from clients.training.personalisation.methods.none import NoPersonalisation
from clients.training.pruning import model_structure
from strategies.compression import decode
from strategies.plugins.pruning.prunefl import PruneFL
from strategies.wire.pruning_mask import PruningError, mask_record

MASKS = {"0.weight": np.array([[True, False, True], [False, False, True]])}


def test_the_mask_sent_is_kept_and_a_later_round_uses_it(tmp_path):
    sent = received_mask(mask_record(MASKS), 3, "fed", tmp_path)
    np.testing.assert_array_equal(sent["0.weight"], MASKS["0.weight"])
    held = received_mask({}, 3, "fed", tmp_path)  # no mask in the instruction: the saved one
    np.testing.assert_array_equal(held["0.weight"], MASKS["0.weight"])


@pytest.mark.parametrize("version", [2, 4])
def test_a_site_without_the_named_version_refuses_the_round(tmp_path, version):
    received_mask(mask_record(MASKS), 3, "fed", tmp_path)
    with pytest.raises(MaskVersionError, match=f"version {version} is not held"):
        received_mask({}, version, "fed", tmp_path)
    with pytest.raises(MaskVersionError, match="holds none"):
        received_mask({}, 1, "another-federation", tmp_path)


def test_a_malformed_mask_is_refused(tmp_path):
    record = mask_record(MASKS)
    record["pruning-bits"] = record["pruning-bits"][:0]
    with pytest.raises(PruningError):
        received_mask(record, 1, "fed", tmp_path)


def test_squared_gradients_are_summed_between_reports_then_sent_encoded(tmp_path):
    order = {"w": np.zeros((2, 2), np.float32), "n": np.zeros((), np.int64),
             "b": np.zeros(2, np.float32)}
    first = {"w": np.full((2, 2), 1.0, np.float32)}  # b had no gradient: zeros
    assert squared_gradient_report(first, order, "", "fed", tmp_path) is None
    second = {"w": np.full((2, 2), 2.0, np.float32), "b": np.array([5.0, 6.0], np.float32)}
    payload = squared_gradient_report(second, order, "none", "fed", tmp_path)
    np.testing.assert_array_equal(decode(payload, "none", 6), [3, 3, 3, 3, 5, 6])
    third = {"w": np.full((2, 2), 1.0, np.float32)}  # a new sum after the report
    payload = squared_gradient_report(third, order, "none", "fed", tmp_path)
    np.testing.assert_array_equal(decode(payload, "none", 6), [1, 1, 1, 1, 0, 0])


def test_a_fedbn_site_refuses_a_structural_change_but_not_an_unstructured_one():
    assert FedBN.keeps_layers and not NoPersonalisation.keeps_layers
    with pytest.raises(StructuralChangeRefused, match="personalisation.method = 'fedbn'"):
        refuse_structural_change("structured", FedBN.keeps_layers)
    refuse_structural_change("unstructured", FedBN.keeps_layers)
    refuse_structural_change("structured", NoPersonalisation.keeps_layers)


def test_unstructured_training_starts_from_the_pruned_weights_at_zero():
    model = nn.Sequential(nn.Linear(3, 2))
    with torch.no_grad():
        model[0].weight.fill_(1.0)
    pruned = PrunedTraining(model, MASKS, "unstructured", torch.zeros(1, 3))
    assert pruned.model is model
    np.testing.assert_array_equal(model[0].weight.detach().numpy() != 0, MASKS["0.weight"])


EXAMPLE = torch.zeros(1, 2, 8, 8)


def _structured(channels: int, density: float, seed: int) -> tuple[nn.Module, dict]:
    """A two-conv network, its structured PruneFL mask at ``density``, the pruned weights 0."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(2, channels, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(channels, 1, 1))
    pruning = PruneFL(mode="structured", initial_density=density)
    named = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    pruning.initialise(named, model_structure(model, "structured", EXAMPLE))
    _zero_pruned(model, pruning.masks)
    return model, pruning.masks


def _zero_pruned(model: nn.Module, masks: dict) -> None:
    with torch.no_grad():
        for name, mask in masks.items():
            dict(model.named_parameters())[name].mul_(torch.as_tensor(mask, dtype=torch.float32))


def test_a_structured_site_cuts_its_network_once_per_mask_and_loads_each_round_into_it():
    model, masks = _structured(6, 0.5, seed=0)
    first = PrunedTraining(model, masks, "structured", EXAMPLE)
    with torch.no_grad():  # the next round's global model: other weights, same mask
        for p in model.parameters():
            p.add_(1.0)
    _zero_pruned(model, masks)
    second = PrunedTraining(model, masks, "structured", EXAMPLE)
    assert second.model is first.model  # cut once
    x = torch.randn(3, 2, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(second.model(x), model(x), atol=1e-5, rtol=1e-5)


def test_a_structured_evaluation_runs_the_network_without_its_pruned_channels():
    model, masks = _structured(8, 0.25, seed=1)
    small = evaluated_network(model, masks, "structured", EXAMPLE)
    assert sum(p.numel() for p in small.parameters()) < sum(p.numel() for p in model.parameters())
    x = torch.randn(2, 2, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(small(x), model(x), atol=1e-5, rtol=1e-5)
    assert evaluated_network(model, masks, "unstructured", EXAMPLE) is model
