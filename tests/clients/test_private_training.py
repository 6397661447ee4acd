"""DP-SGD at a site (clients/training/private_training.py) for the three tasks' models."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from opacus import GradSampleModule
from torch import nn

from clients.registry import task_class
from clients.training.trainer import select_device
from clients.training.private_training import (GRAD_SAMPLE_MODES, DpSettings, dp_compatible,
                                               noise_only_step, poisson_sample_rate,
                                               private_training)
from clients.training.site_task import TaskSettings
from models.convlstm import ConvLSTMClassifier3D

SETTINGS = {"cxr-cls": TaskSettings(image_size=32, batch_size=2),
            "ct3d-cls": TaskSettings(image_size=32, volume_depth=4, batch_size=2),
            "pe-seg": TaskSettings(image_size=32, slab_slices=3, batch_size=2)}
DP = DpSettings(noise_multiplier=1.0, max_grad_norm=1.0, delta=1e-5)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=sorted(SETTINGS))
def site_task(request, synthetic_site):
    name = request.param
    return task_class(name)(synthetic_site(name, seed=3, image_size=32), SETTINGS[name])


def test_dp_sgd_trains_each_task_and_reports_its_steps(site_task):
    torch.manual_seed(0)
    model = site_task.build_model(private=True)
    before = [p.detach().clone() for p in model.parameters()]
    result = site_task.train(model, steps=3, lr=1e-2, momentum=0.9, compute=select_device("cpu"),
                             seed=1, optimizer="sgd", privacy=DP)
    q = poisson_sample_rate(len(site_task.train_set), site_task.settings.batch_size)
    assert result.steps_done == 3
    assert result.privacy_steps == ((1.0, q, 3),)
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert not any(hasattr(p, "grad_sample") and p.grad_sample is not None
                   for p in model.parameters())  # Opacus's hooks and buffers removed


def test_planned_sample_rate_is_the_one_opacus_uses(site_task):
    loader = site_task._train_loader(0, select_device("cpu"))
    assert poisson_sample_rate(len(site_task.train_set), site_task.settings.batch_size) == \
        pytest.approx(1.0 / len(loader))


def test_server_and_site_build_one_private_architecture(site_task):
    """The server's model (``model_for_run``) and a site's have the same keys and shapes,
    with no buffer (nothing in the update that the noised gradients did not produce)."""
    server = type(site_task).model_for_run(site_task.settings, private=True)
    site = site_task.build_model(private=True)
    shapes = {k: v.shape for k, v in server.state_dict().items()}
    assert shapes == {k: v.shape for k, v in site.state_dict().items()}
    assert set(shapes) == {name for name, _ in site.named_parameters()}
    site.load_state_dict(server.state_dict())


def test_batchnorm_becomes_groupnorm_and_the_change_is_reported():
    model = task_class("cxr-cls").model_for(SETTINGS["cxr-cls"])
    assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    fixed, changes = dp_compatible(model)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in fixed.modules())
    assert any("GroupNorm" in c for c in changes)
    assert any("in-place" in c for c in changes)


def test_unfolded_convlstm_computes_the_same_function():
    torch.manual_seed(0)
    model = ConvLSTMClassifier3D(widths=(4, 4, 4, 4)).eval()
    x = torch.randn(2, 1, 3, 16, 16)
    folded = model(x)
    for m in model.modules():
        if hasattr(m, "fold_slices"):
            m.fold_slices = False
    torch.testing.assert_close(model(x), folded)


def _grad_samples(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    wrapped = GradSampleModule(model, loss_reduction="sum")
    wrapped(x).sum().backward()
    samples = [p.grad_sample for p in model.parameters()]
    wrapped._close()
    return samples


def test_convlstm_per_example_gradients_are_each_volumes_own():
    """Opacus's per-example gradient of volume i equals the gradient of volume i alone,
    through the ConvLSTM cell used at every slice (repeated module use)."""
    torch.manual_seed(0)
    model, _ = dp_compatible(ConvLSTMClassifier3D(widths=(4, 4, 4, 4)))
    x = torch.randn(3, 1, 3, 16, 16)
    samples = _grad_samples(model, x)
    for i in range(3):
        model.zero_grad()
        model(x[i:i + 1]).sum().backward()
        for p, g in zip(model.parameters(), samples):
            torch.testing.assert_close(g[i], p.grad, atol=1e-3, rtol=1e-3)


def test_folded_slices_break_per_example_gradients():
    """Folding slices into the batch gives Opacus B x T "examples": why DP unfolds them."""
    torch.manual_seed(0)
    model, _ = dp_compatible(ConvLSTMClassifier3D(widths=(4, 4, 4, 4)))
    for m in model.modules():
        if hasattr(m, "fold_slices"):
            m.fold_slices = True
    samples = _grad_samples(model, torch.randn(2, 1, 3, 16, 16))
    assert {g.shape[0] for g in samples} != {2}


def test_pe_seg_private_loss_is_a_mean_of_per_slab_losses():
    loss_fn = task_class("pe-seg").private_loss_fn()
    torch.manual_seed(0)
    logits, target = torch.randn(3, 1, 8, 8), (torch.rand(3, 1, 8, 8) > 0.7).float()
    per_slab = torch.stack([loss_fn(logits[i:i + 1], target[i:i + 1]) for i in range(3)])
    torch.testing.assert_close(loss_fn(logits, target), per_slab.mean())


def test_empty_poisson_batch_is_a_counted_noise_only_step():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    data = torch.utils.data.TensorDataset(torch.randn(8, 3), torch.randn(8, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=2)
    before = model.weight.detach().clone()
    with private_training(model, torch.optim.SGD(model.parameters(), lr=0.1), loader,
                          DP) as (optimizer, _, accountant):
        noise_only_step(optimizer)
    assert accountant.history == [(1.0, 0.25, 1)]
    assert not torch.equal(model.weight, before)  # the noise moved it


def test_noise_and_poisson_sample_are_not_reproducible_from_the_run_seed():
    """Found: the noise, and later the Poisson sample, came from torch's global generator,
    seeded from the run config's seed, round and site name, all known to the server: it
    could regenerate and subtract the noise, or tell in which steps each example was
    sampled, which voids the accountant's amplification by subsampling."""
    data = torch.utils.data.TensorDataset(torch.arange(64.0).reshape(64, 1), torch.zeros(64, 1))
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        model = nn.Linear(1, 1)
        loader = torch.utils.data.DataLoader(data, batch_size=16)
        with private_training(model, torch.optim.SGD(model.parameters(), lr=0.1), loader,
                              DP) as (optimizer, dp_loader, _):
            sample = [x.flatten().tolist() for x, _ in dp_loader]
            noise_only_step(optimizer)
        runs.append((model.weight.detach().clone(), sample))
    assert not torch.equal(runs[0][0], runs[1][0])  # the noise
    assert runs[0][1] != runs[1][1]  # the sample; the same with probability 0.625**256


@pytest.mark.parametrize("mode", GRAD_SAMPLE_MODES)
def test_each_grad_sample_mode_gives_each_examples_own_gradient(mode):
    """What DP-SGD clips: per-example gradients of the layer types of the three models
    (convolution, GroupNorm, PReLU, transposed convolution, linear), in every mode."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.PReLU(),
                          nn.ConvTranspose2d(4, 2, 2, stride=2), nn.Flatten(),
                          nn.Linear(2 * 16 * 16, 1))
    x = torch.randn(3, 1, 8, 8)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.zeros(3, 1)),
                                         batch_size=3)
    with private_training(model, torch.optim.SGD(model.parameters(), lr=0.1), loader,
                          replace(DP, grad_sample_mode=mode)):
        model(x).square().mean().backward()
        samples = [p.grad_sample.clone() for p in model.parameters()]
    for i in range(3):
        model.zero_grad()
        model(x[i:i + 1]).square().mean().backward()
        for p, g in zip(model.parameters(), samples):
            torch.testing.assert_close(g[i], p.grad, atol=1e-5, rtol=1e-4)
