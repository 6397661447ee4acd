"""Closed-form per-example gradients for the layers of the three tasks' DP models.

Opacus's ``hooks`` mode (:class:`opacus.GradSampleModule`) computes each
layer's per-example gradients from the layer's input activations ``a`` and the
back-propagated errors ``b`` of its output (Goodfellow, "Efficient per-example
gradient computations", arXiv:1510.01799, 2015): for a linear map
``y_n = W a_n`` the gradient of example ``n`` is ``b_n a_n^T``. A layer type
without a registered "grad sampler" falls back to ``torch.func.vmap`` of its
own gradient, which on CPU costs several times its backward pass. This module
registers, through Opacus's public :func:`opacus.grad_sample.register_grad_sampler`,
closed forms for the layer types the DP models use:

- :class:`torch.nn.Conv2d`: ``G_n = B_n U(a_n)^T`` with ``U`` the im2col unfolding
  (Rochette, Manoel & Tramel, "Efficient per-example gradient computations in
  convolutional neural networks", arXiv:1912.06015, 2019, sec. 3); a 1x1
  convolution needs no unfolding, and one batched matrix product gives the
  gradients in the weight's layout (Opacus's own sampler adds a diagonal
  extraction and a copy, meant for grouped convolutions, which the models do
  not have; those keep Opacus's).
- :class:`torch.nn.ConvTranspose2d` (the U-Net's up-sampling): the transposed
  convolution's weight gradient is the correlation of its input with the
  unfolded output errors, ``G_n = a_n U_s(b_n)^T`` with ``U_s`` unfolding at
  the layer's stride, padding and dilation (Dumoulin & Visin, "A guide to
  convolution arithmetic for deep learning", arXiv:1603.07285, sec. 4).
- :class:`torch.nn.PReLU` (MONAI's residual units): ``y = max(0, x) + w min(0, x)``,
  so ``dL/dw_c = sum_p b_p min(0, x_p)`` over the positions ``p`` of channel ``c``
  (all channels for one shared ``w``).

Every formula is exact (the tests compare each with the gradient of each example
alone); clipping, noise and accounting stay Opacus's. :func:`register` is called
by :func:`clients.training.private_training.private_training` before Opacus
hooks a model, so a process that never trains with DP-SGD never imports Opacus.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from clients.training.opacus_loader import opacus

__all__ = ["conv2d_grad_sample", "conv_transpose2d_grad_sample", "prelu_grad_sample",
           "register"]

Samples = dict[nn.Parameter, torch.Tensor]


def _plain(layer: nn.Module) -> bool:
    """One group, numeric padding, no output padding beyond the stride: the closed forms' case."""
    return layer.groups == 1 and not isinstance(layer.padding, str)


def conv2d_grad_sample(layer: nn.Conv2d, activations: Sequence[torch.Tensor],
                       backprops: torch.Tensor) -> Samples:
    """Per-example ``weight`` (and ``bias``) gradients of a 2D convolution, ``(N, *shape)``."""
    a = activations[0].to(backprops.dtype)
    n = a.shape[0]
    if n == 0 or not _plain(layer):
        return opacus("grad_sample.conv").compute_conv_grad_sample(layer, activations, backprops)
    b = backprops.reshape(n, backprops.shape[1], -1)
    samples: Samples = {}
    if layer.weight.requires_grad:
        pointwise = (layer.kernel_size == (1, 1) and layer.stride == (1, 1)
                     and layer.padding == (0, 0))
        cols = (a.reshape(n, a.shape[1], -1) if pointwise else
                F.unfold(a, layer.kernel_size, layer.dilation, layer.padding, layer.stride))
        samples[layer.weight] = torch.bmm(b, cols.transpose(1, 2)).view(n, *layer.weight.shape)
    if layer.bias is not None and layer.bias.requires_grad:
        samples[layer.bias] = b.sum(dim=2)
    return samples


def conv_transpose2d_grad_sample(layer: nn.ConvTranspose2d, activations: Sequence[torch.Tensor],
                                 backprops: torch.Tensor) -> Samples:
    """Per-example gradients of a 2D transposed convolution (one group), ``(N, *shape)``.

    ``U_s(b_n)`` has one column per input position: the output errors the kernel
    touched from there (``output_padding < stride`` adds no column).
    """
    a = activations[0].to(backprops.dtype)
    n = a.shape[0]
    samples: Samples = {}
    if layer.weight.requires_grad:
        cols = F.unfold(backprops, layer.kernel_size, layer.dilation, layer.padding, layer.stride)
        cols = cols[..., :a.shape[2] * a.shape[3]]
        grad = torch.bmm(a.reshape(n, a.shape[1], -1), cols.transpose(1, 2))
        samples[layer.weight] = grad.view(n, *layer.weight.shape)
    if layer.bias is not None and layer.bias.requires_grad:
        samples[layer.bias] = backprops.reshape(n, backprops.shape[1], -1).sum(dim=2)
    return samples


def prelu_grad_sample(layer: nn.PReLU, activations: Sequence[torch.Tensor],
                      backprops: torch.Tensor) -> Samples:
    """Per-example gradient of PReLU's slope(s): ``sum_p b_p min(0, x_p)`` per channel."""
    x = activations[0].to(backprops.dtype)
    n = x.shape[0]
    if not layer.weight.requires_grad:
        return {}
    terms = backprops * x.clamp(max=0)
    if layer.weight.numel() == 1:
        return {layer.weight: terms.reshape(n, -1).sum(dim=1, keepdim=True)}
    return {layer.weight: terms.reshape(n, terms.shape[1], -1).sum(dim=2)}


def _transpose_supported(layer: nn.ConvTranspose2d) -> bool:
    return _plain(layer) and all(o < s for o, s in zip(layer.output_padding, layer.stride))


def _conv_transpose(layer: nn.ConvTranspose2d, activations: Sequence[torch.Tensor],
                    backprops: torch.Tensor) -> Samples:
    if activations[0].shape[0] and _transpose_supported(layer):
        return conv_transpose2d_grad_sample(layer, activations, backprops)
    return opacus("grad_sample.functorch").ft_compute_per_sample_gradient(
        layer, activations, backprops)


def register() -> None:
    """Make these Opacus's grad samplers for ``Conv2d``, ``ConvTranspose2d`` and ``PReLU``."""
    register_grad_sampler = opacus("grad_sample").register_grad_sampler
    register_grad_sampler(nn.Conv2d)(conv2d_grad_sample)
    register_grad_sampler(nn.ConvTranspose2d)(_conv_transpose)
    register_grad_sampler(nn.PReLU)(prelu_grad_sample)
