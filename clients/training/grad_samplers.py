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

- :class:`torch.nn.Conv2d` and :class:`torch.nn.ConvTranspose2d` (the U-Net's
  up-sampling): with few channels the batch is folded into the channels of ONE
  convolution with ``groups = N`` (input ``(1, N C_in, H, W)``, weight repeated ``N``
  times), whose weight gradient, from PyTorch's own convolution backward, is the ``N``
  examples' gradients side by side (the grouped-convolution formulation of Rochette,
  Manoel & Tramel, "Efficient per-example gradient computations in convolutional
  neural networks", arXiv:1912.06015, 2019, sec. 3.2), 2-6x faster on CPU than
  Opacus's unfolding (im2col, ``k^2`` times the activations) and per-example products
  ``G_n = B_n U(a_n)^T``; with many channels (:data:`GROUPED_MAX_CHANNEL_PAIRS`) the
  unfolded product is the faster and is kept (a transposed convolution's: its input
  times the unfolded output errors). A 1x1 convolution needs no unfolding. Transposed
  convolutions are otherwise ``vmap``-ed.
- the slice-wise layers of :mod:`models.slice_layers` (the ConvLSTM's layers shared by
  a volume's slices): the 2D rule on the ``B T`` slices, summed over each volume's
  ``T`` slices (the chain rule through a weight shared by the slices).
- :class:`torch.nn.PReLU` (MONAI's residual units): ``y = max(0, x) + w min(0, x)``,
  so ``dL/dw_c = sum_p b_p min(0, x_p)`` over the positions ``p`` of channel ``c``
  (all channels for one shared ``w``).

Every formula is exact (the tests compare each with the gradient of each example
alone); clipping, noise and accounting stay Opacus's. :func:`register` is called
by :func:`clients.training.private_training.private_training` before Opacus
hooks a model, so a process that never trains with DP-SGD never imports Opacus.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from clients.training.opacus_loader import opacus
from models.slice_layers import SliceConv2d, SliceGroupNorm

__all__ = ["conv2d_grad_sample", "conv_transpose2d_grad_sample", "prelu_grad_sample",
           "register"]

Samples = dict[nn.Parameter, torch.Tensor]
#: Below this many (input, output) channel pairs the grouped convolution is the faster on CPU
#: (measured on the three models' layers); above it the unfolded product.
GROUPED_MAX_CHANNEL_PAIRS = 4096
GradSampler = Callable[[nn.Module, Sequence[torch.Tensor], torch.Tensor], Samples]


def _plain(layer: nn.Module) -> bool:
    """One group and numeric padding: the closed forms' case (the models have no other)."""
    return layer.groups == 1 and not isinstance(layer.padding, str)


def _per_example_weight_grads(layer: nn.Conv2d | nn.ConvTranspose2d, a: torch.Tensor,
                              b: torch.Tensor, transposed: bool) -> torch.Tensor:
    """``(N, *weight.shape)``: the weight gradient of ``N`` groups, one per example.

    The batch is folded into the channels (``(1, N C, H, W)``) of one convolution with
    ``groups = N``, whose weight gradient is each example's own: one native
    convolution-backward call instead of an im2col copy ``k^2`` times the activations.
    """
    n = a.shape[0]
    weight = layer.weight.detach().repeat(n, *([1] * (layer.weight.dim() - 1)))
    output_padding = list(layer.output_padding) if transposed else [0, 0]
    _, grad, _ = torch.ops.aten.convolution_backward(
        b.reshape(1, -1, *b.shape[2:]), a.reshape(1, -1, *a.shape[2:]), weight, None,
        list(layer.stride), list(layer.padding), list(layer.dilation), transposed,
        output_padding, n, [False, True, False])
    return grad.view(n, *layer.weight.shape)


def _grouped_is_faster(layer: nn.Conv2d | nn.ConvTranspose2d) -> bool:
    """The grouped convolution for up to :data:`GROUPED_MAX_CHANNEL_PAIRS` channel pairs."""
    return layer.in_channels * layer.out_channels < GROUPED_MAX_CHANNEL_PAIRS


def conv2d_grad_sample(layer: nn.Conv2d, activations: Sequence[torch.Tensor],
                       backprops: torch.Tensor) -> Samples:
    """Per-example ``weight`` (and ``bias``) gradients of a 2D convolution, ``(N, *shape)``."""
    a = activations[0].to(backprops.dtype)
    n = a.shape[0]
    pointwise = layer.kernel_size == (1, 1) and layer.stride == (1, 1) and layer.padding == (0, 0)
    if n == 0 or not _plain(layer) or not (pointwise or _grouped_is_faster(layer)):
        return opacus("grad_sample.conv").compute_conv_grad_sample(layer, activations, backprops)
    samples: Samples = {}
    if layer.weight.requires_grad:
        if pointwise:
            grad = torch.bmm(backprops.reshape(n, backprops.shape[1], -1),
                             a.reshape(n, a.shape[1], -1).transpose(1, 2))
            samples[layer.weight] = grad.view(n, *layer.weight.shape)
        else:
            samples[layer.weight] = _per_example_weight_grads(layer, a, backprops, False)
    if layer.bias is not None and layer.bias.requires_grad:
        samples[layer.bias] = backprops.reshape(n, backprops.shape[1], -1).sum(dim=2)
    return samples


def conv_transpose2d_grad_sample(layer: nn.ConvTranspose2d, activations: Sequence[torch.Tensor],
                                 backprops: torch.Tensor) -> Samples:
    """Per-example gradients of a 2D transposed convolution (one group), ``(N, *shape)``.

    Many channel pairs: the correlation of the input with the unfolded output errors,
    ``G_n = a_n U_s(b_n)^T``, ``U_s`` unfolding at the layer's stride, padding and dilation
    (one column per input position; Dumoulin & Visin, arXiv:1603.07285, sec. 4).
    """
    a = activations[0].to(backprops.dtype)
    n = a.shape[0]
    samples: Samples = {}
    if layer.weight.requires_grad:
        if _grouped_is_faster(layer):
            samples[layer.weight] = _per_example_weight_grads(layer, a, backprops, True)
        else:
            cols = F.unfold(backprops, layer.kernel_size, layer.dilation, layer.padding,
                            layer.stride)[..., :a.shape[2] * a.shape[3]]
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


def _conv_transpose(layer: nn.ConvTranspose2d, activations: Sequence[torch.Tensor],
                    backprops: torch.Tensor) -> Samples:
    if activations[0].shape[0] and _plain(layer):
        return conv_transpose2d_grad_sample(layer, activations, backprops)
    return opacus("grad_sample.functorch").ft_compute_per_sample_gradient(
        layer, activations, backprops)


def _summed_over_slices(sampler: GradSampler) -> GradSampler:
    """The per-example gradients of a slice-wise layer (:mod:`models.slice_layers`): its
    input ``(B, T, ..., C, H, W)`` folded to ``B T`` slices for ``sampler``, each volume's
    gradient the sum of its slices' (the layer's weights are shared by the slices)."""

    def per_volume(layer: nn.Module, activations: Sequence[torch.Tensor],
                   backprops: torch.Tensor) -> Samples:
        a = activations[0]
        n = a.shape[0]
        if n == 0:
            return {p: p.new_zeros((0, *p.shape)) for p in layer.parameters() if p.requires_grad}
        per_slice = sampler(layer, [a.reshape(-1, *a.shape[-3:])],
                            backprops.reshape(-1, *backprops.shape[-3:]))
        return {p: g.view(n, -1, *g.shape[1:]).sum(dim=1) for p, g in per_slice.items()}

    return per_volume


def register() -> None:
    """Make these Opacus's grad samplers for ``Conv2d``, ``ConvTranspose2d``, ``PReLU`` and
    the slice-wise ``SliceConv2d`` and ``SliceGroupNorm``."""
    register_grad_sampler = opacus("grad_sample").register_grad_sampler
    register_grad_sampler(nn.Conv2d)(conv2d_grad_sample)
    register_grad_sampler(nn.ConvTranspose2d)(_conv_transpose)
    register_grad_sampler(nn.PReLU)(prelu_grad_sample)
    register_grad_sampler(SliceConv2d)(_summed_over_slices(conv2d_grad_sample))
    register_grad_sampler(SliceGroupNorm)(_summed_over_slices(
        opacus("grad_sample.group_norm").compute_group_norm_grad_sample))
