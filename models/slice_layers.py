"""Layers that apply one 2D layer to every slice of a batch of volumes in one call.

A network that reads a CT volume as a sequence of slices (the ConvLSTM of
:mod:`models.convlstm`) applies the same 2D layers to every slice. The fast way
folds the slices into the batch, ``(B, T, C, H, W) -> (B T, C, H, W)``; but
per-example gradients (DP-SGD, Abadi et al. 2016) are taken along the first
dimension of a layer's input, which would then count ``B T`` slices instead of
``B`` volumes. The layers here take the volumes ``(B, T, C, H, W)`` (any leading
dimensions), fold them only inside their own call and unfold the result, so the
layer is called once for all slices and its input's first dimension is still the
volumes': a per-example gradient rule sums the slices' contributions of each
volume (``clients.training.grad_samplers``). Each is its 2D layer's subclass with
the same parameters and state-dict keys, so a model converts in place
(:func:`slice_wise`) and computes the same function.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SliceConv2d", "SliceGroupNorm", "SliceMaxPool2d", "SLICE_LAYERS", "slice_wise",
           "takes_slices", "per_slice"]


def per_slice(module: nn.Module, x: torch.Tensor, fold: bool) -> torch.Tensor:
    """``module`` on every slice of ``x`` ``(B, T, C, H, W)``, stacked back to ``(B, T, ...)``.

    ``fold``: one call on the ``(B*T)`` batch (fast); else a batch of ``B`` volumes, the
    layout per-example gradients (DP-SGD) need: one call if ``module``'s layers are
    slice-wise (:mod:`models.slice_layers`), else one call per slice. Same values.
    """
    if fold:
        y = module(x.flatten(0, 1))
        return y.reshape(*x.shape[:2], *y.shape[1:])
    if takes_slices(module):
        return module(x)
    return torch.stack([module(s) for s in x.unbind(1)], dim=1)


def _folded(layer: nn.Module, forward, x: torch.Tensor) -> torch.Tensor:
    """``forward`` (the 2D layer's) on ``x`` ``(..., C, H, W)`` folded to ``(-1, C, H, W)``."""
    y = forward(layer, x.reshape(-1, *x.shape[-3:]))
    return y.reshape(*x.shape[:-3], *y.shape[1:])


class SliceConv2d(nn.Conv2d):
    """:class:`torch.nn.Conv2d` on every slice of ``(..., C, H, W)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return _folded(self, nn.Conv2d.forward, x)


class SliceGroupNorm(nn.GroupNorm):
    """:class:`torch.nn.GroupNorm` on every slice of ``(..., C, H, W)`` (each slice its own
    statistics, as the folded 2D layer)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return _folded(self, nn.GroupNorm.forward, x)


class SliceMaxPool2d(nn.MaxPool2d):
    """:class:`torch.nn.MaxPool2d` on every slice of ``(..., C, H, W)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        return _folded(self, nn.MaxPool2d.forward, x)


#: 2D layer type -> its slice-wise subclass.
SLICE_LAYERS: dict[type[nn.Module], type[nn.Module]] = {
    nn.Conv2d: SliceConv2d, nn.GroupNorm: SliceGroupNorm, nn.MaxPool2d: SliceMaxPool2d}
#: Layers that take any shape as they are (elementwise).
_ELEMENTWISE = (nn.ReLU, nn.Identity)


def slice_wise(module: nn.Module) -> int:
    """Make every 2D layer under ``module`` (itself included) its slice-wise subclass, in
    place (same parameters, same function on 4D inputs); the number of layers changed."""
    layers = [m for m in module.modules() if type(m) in SLICE_LAYERS]
    for layer in layers:
        layer.__class__ = SLICE_LAYERS[type(layer)]
    return len(layers)


def takes_slices(module: nn.Module) -> bool:
    """Whether ``module`` can be called once on ``(B, T, C, H, W)``: a slice-wise layer, or
    a :class:`torch.nn.Sequential` of slice-wise and elementwise layers."""
    layers = list(module) if isinstance(module, nn.Sequential) else [module]
    return all(isinstance(m, (*SLICE_LAYERS.values(), *_ELEMENTWISE)) for m in layers)
