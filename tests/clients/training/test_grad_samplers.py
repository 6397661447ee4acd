"""The closed-form per-example gradients (clients/training/grad_samplers.py) and DP-SGD's
clipping with them: each example's gradient is its own, and the clipped sum Opacus noises is
the sum of each example's own gradient clipped to C, for the three tasks' DP models."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from clients.registry import task_class
from clients.training.grad_samplers import (conv2d_grad_sample, conv_transpose2d_grad_sample,
                                            prelu_grad_sample)
from clients.training.private_training import DpSettings, private_training
from clients.training.site_task import TaskSettings

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LAYERS = {
    "conv 3x3 stride 2, bias": (nn.Conv2d(3, 5, 3, stride=2, padding=1), (4, 3, 9, 9),
                                conv2d_grad_sample),
    "conv 1x1": (nn.Conv2d(6, 4, 1, bias=False), (4, 6, 5, 5), conv2d_grad_sample),
    "conv 7x7 stride 2 dilation 2": (nn.Conv2d(2, 3, 7, stride=2, padding=3, dilation=2),
                                     (3, 2, 16, 16), conv2d_grad_sample),
    "transposed 3x3 stride 2, output padding 1": (
        nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1), (4, 4, 6, 6),
        conv_transpose2d_grad_sample),
    "transposed 2x2 stride 2": (nn.ConvTranspose2d(4, 2, 2, stride=2), (3, 4, 5, 5),
                                conv_transpose2d_grad_sample),
    "transposed 3x3 stride 1": (nn.ConvTranspose2d(3, 2, 3, padding=1, bias=False),
                                (2, 3, 7, 7), conv_transpose2d_grad_sample),
    "conv 3x3, many channels (unfolded)": (nn.Conv2d(64, 64, 3, padding=1), (3, 64, 4, 4),
                                           conv2d_grad_sample),
    "transposed 3x3 stride 2, many channels (unfolded)": (
        nn.ConvTranspose2d(96, 48, 3, stride=2, padding=1, output_padding=1), (3, 96, 3, 3),
        conv_transpose2d_grad_sample),
    "PReLU per channel": (nn.PReLU(5, init=0.2), (4, 5, 6, 6), prelu_grad_sample),
    "PReLU shared": (nn.PReLU(init=0.3), (4, 5, 6, 6), prelu_grad_sample),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_each_examples_gradient_is_the_gradient_of_that_example_alone(name):
    """Both ways of a convolution's rule (grouped convolution, unfolded product) included."""
    torch.manual_seed(0)
    layer, shape, sampler = LAYERS[name]
    x = torch.randn(shape)
    out = layer(x)
    backprops = torch.randn_like(out)  # dL/d(output) of some loss, example by example
    samples = sampler(layer, [x], backprops)
    assert set(samples) == {p for p in layer.parameters()}
    for i in range(shape[0]):
        layer.zero_grad()
        (layer(x[i:i + 1]) * backprops[i:i + 1]).sum().backward()
        for p in layer.parameters():
            torch.testing.assert_close(samples[p][i], p.grad, atol=1e-5, rtol=1e-4)


SETTINGS = {"cxr-cls": TaskSettings(image_size=32, batch_size=4),
            "ct3d-cls": TaskSettings(image_size=32, volume_depth=4, batch_size=3),
            "pe-seg": TaskSettings(image_size=32, slab_slices=3, batch_size=3)}
INPUTS = {"cxr-cls": ((4, 1, 32, 32), (4, 1)), "ct3d-cls": ((3, 1, 4, 32, 32), (3, 1)),
          "pe-seg": ((3, 3, 32, 32), (3, 1, 32, 32))}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_dp_sgd_sums_each_examples_own_gradient_clipped_to_c(name):
    """What DP-SGD noises (Abadi et al. 2016, Alg. 1): sum_i g_i min(1, C / ||g_i||), with
    g_i the gradient of example i alone, through Opacus with these grad samplers."""
    torch.manual_seed(0)
    task = task_class(name)
    model, loss_fn = task.model_for_run(SETTINGS[name], private=True), task.private_loss_fn()
    x_shape, y_shape = INPUTS[name]
    x, y = torch.randn(x_shape), (torch.rand(y_shape) > 0.7).float()
    clip = 0.05  # well below every example's gradient norm: each one is clipped
    own = []
    for i in range(x.shape[0]):
        model.zero_grad()
        loss_fn(model(x[i:i + 1]), y[i:i + 1]).backward()
        own.append([p.grad.detach().clone() for p in model.parameters()])
    norms = [torch.sqrt(sum(g.pow(2).sum() for g in grads)) for grads in own]
    assert min(norms) > clip
    expected = [sum(grads[k] * min(1.0, clip / float(n)) for grads, n in zip(own, norms))
                for k in range(len(own[0]))]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                         batch_size=x.shape[0])
    settings = DpSettings(noise_multiplier=1.0, max_grad_norm=clip)
    with private_training(model, torch.optim.SGD(model.parameters(), lr=0.1), loader,
                          settings) as (optimizer, _, _):
        model.zero_grad()
        # a mean over the batch, as the training loop's loss: Opacus rescales it by the batch
        loss_fn(model(x), y).backward()
        optimizer.clip_and_accumulate()
        summed = [p.summed_grad for p in model.parameters()]
        optimizer.zero_grad(set_to_none=True)
    for got, want in zip(summed, expected):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-3)
