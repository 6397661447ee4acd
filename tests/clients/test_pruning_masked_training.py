"""Training under a pruning mask (clients/training/pruning.py MaskedTraining): pruned weights
neither move nor count in DP-SGD's clipping; squared gradients summed as PruneFL needs."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from clients.registry import task_class
from clients.training.private_training import DpSettings, noise_only_step, private_training
from clients.training.pruning import MaskedTraining, PruningSurgeryError
from clients.training.site_task import TaskSettings, make_optimizer
from clients.training.trainer import select_device, train_steps

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CPU = select_device("cpu")


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _half_masks(model: nn.Module, seed: int = 1) -> dict[str, np.ndarray]:
    """Half the first layer's weights pruned (a later layer's pruned weight would leave some
    kept ones before it without a gradient)."""
    name, weight = next(iter(model.named_parameters()))
    return {name: np.random.default_rng(seed).random(tuple(weight.shape)) < 0.5}


def _dataset(n: int = 32) -> TensorDataset:
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(2))
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


def _check_pruned_zero_kept_moved(model: nn.Module, start: nn.Module,
                                  masks: dict[str, np.ndarray]) -> None:
    before = dict(start.named_parameters())
    for name, p in model.named_parameters():
        if name not in masks:
            continue
        kept = torch.as_tensor(masks[name])
        assert torch.count_nonzero(p.detach()[~kept]) == 0, name
        assert torch.all(p.detach()[kept] != before[name].detach()[kept]), name


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_five_masked_steps_keep_pruned_weights_zero_and_move_kept_ones(optimizer):
    model = _net()
    masks = _half_masks(model)
    hooks = MaskedTraining(masks, collect=False)
    hooks.zero_pruned(model)
    start = copy.deepcopy(model)
    train_steps(model, DataLoader(_dataset(), batch_size=8), nn.functional.mse_loss,
                make_optimizer(optimizer, model.parameters(), 0.05, 0.9), steps=5,
                compute=CPU, step_hooks=hooks)
    _check_pruned_zero_kept_moved(model, start, masks)


def test_five_dp_sgd_steps_keep_pruned_weights_zero_and_move_kept_ones():
    model = _net()
    masks = _half_masks(model)
    hooks = MaskedTraining(masks, collect=True)
    hooks.zero_pruned(model)
    start = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with private_training(model, opt, DataLoader(_dataset(), batch_size=8),
                          DpSettings(noise_multiplier=1.0)) as (dp_opt, dp_loader, _):
        train_steps(model, dp_loader, nn.functional.mse_loss, dp_opt, steps=5, compute=CPU,
                    empty_batch_step=noise_only_step, step_hooks=hooks)
    _check_pruned_zero_kept_moved(model, start, masks)
    assert set(hooks.squared_gradients()) == {name for name, _ in model.named_parameters()}


def test_site_task_threads_the_hooks_through_dp_sgd(synthetic_site):
    task = task_class("tabular-cls")(synthetic_site("tabular-cls", seed=3),
                                     TaskSettings(num_labels=1, batch_size=4))
    model = task.build_model(private=True)
    masks = _half_masks(model)
    hooks = MaskedTraining(masks, collect=False)
    hooks.zero_pruned(model)
    start = copy.deepcopy(model)
    result = task.train(model, steps=5, lr=0.05, momentum=0.9, compute=CPU, seed=0,
                        optimizer="sgd", privacy=DpSettings(noise_multiplier=1.0),
                        step_hooks=hooks)
    assert result.steps_done == 5
    _check_pruned_zero_kept_moved(model, start, masks)


def test_squared_gradients_sum_the_unmasked_gradients_of_every_step():
    """PruneFL's report: sum over the local steps of g^2, every coordinate (pruned ones too)."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    masks = {"weight": np.array([[True, False, True], [False, True, True]])}
    batches = [(torch.randn(4, 3), torch.randn(4, 2)) for _ in range(3)]
    hand = copy.deepcopy(model)
    with torch.no_grad():
        hand.weight.mul_(torch.as_tensor(masks["weight"]).float())
    expected = {"weight": torch.zeros(2, 3), "bias": torch.zeros(2)}
    for x, y in batches:
        hand.zero_grad()
        nn.functional.mse_loss(hand(x), y).backward()
        with torch.no_grad():
            for name, p in hand.named_parameters():
                expected[name] += p.grad ** 2
                p -= 0.1 * p.grad * (torch.as_tensor(masks[name]).float() if name in masks else 1)
    hooks = MaskedTraining(masks, collect=True)
    hooks.zero_pruned(model)
    train_steps(model, batches, nn.functional.mse_loss, torch.optim.SGD(model.parameters(), lr=0.1),
                steps=3, compute=CPU, step_hooks=hooks)
    squared = hooks.squared_gradients()
    assert set(squared) == {"weight", "bias"}
    for name, value in expected.items():
        np.testing.assert_allclose(squared[name], value.numpy(), rtol=1e-5)
        assert squared[name].dtype == np.float32
    torch.testing.assert_close(model.weight, hand.weight)


def _dp_step_of_one_example(masks: dict[str, np.ndarray] | None) -> torch.Tensor:
    """One DP-SGD step (C = 1, tiny noise) of ``y = w x`` from w = 0 on one example whose
    gradient is -x = (-1000, -0.001): large only at coordinate 0."""
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    data = TensorDataset(torch.tensor([[1000.0, 0.001]]), torch.tensor([[1.0]]))
    hooks = MaskedTraining(masks or {}, collect=False)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    with private_training(model, opt, DataLoader(data, batch_size=1),
                          DpSettings(noise_multiplier=1e-6, max_grad_norm=1.0)) as (dp_opt, loader, _):
        train_steps(model, loader, lambda out, y: 0.5 * ((out - y) ** 2).mean(), dp_opt, steps=1,
                    compute=CPU, empty_batch_step=noise_only_step, step_hooks=hooks)
    return model.weight.detach()[0]


def test_dp_clipping_norm_ignores_pruned_coordinates():
    dense = _dp_step_of_one_example(None)  # the norm 1000 clips the kept coordinate's 0.001 away
    assert abs(float(dense[1])) < 1e-5
    pruned = _dp_step_of_one_example({"weight": np.array([[False, True]])})
    assert float(pruned[0]) == 0.0
    assert float(pruned[1]) == pytest.approx(0.001, rel=1e-2)  # not scaled down


def test_a_mask_that_does_not_fit_the_model_names_the_parameter():
    model = nn.Linear(3, 2)
    with pytest.raises(PruningSurgeryError, match="'weight'"):
        MaskedTraining({"weight": np.ones((3, 2), bool)}, collect=False).zero_pruned(model)
    with pytest.raises(PruningSurgeryError, match="'conv.weight'"):
        MaskedTraining({"conv.weight": np.ones((2, 3), bool)}, collect=False).zero_pruned(model)
