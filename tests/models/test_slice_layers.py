"""Slice-wise layers (models/slice_layers.py): the 2D layer on every slice in one call, the
volumes still the first dimension, and the ConvLSTM made of them computes the same function."""

from __future__ import annotations

import torch
from torch import nn

from models.convlstm import ConvLSTMClassifier3D
from models.slice_layers import (SliceConv2d, SliceGroupNorm, per_slice, slice_wise,
                                 takes_slices)


def test_a_slice_wise_block_is_its_2d_block_on_every_slice():
    torch.manual_seed(0)
    block = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.GroupNorm(2, 4),
                          nn.MaxPool2d(2))
    x = torch.randn(3, 5, 2, 8, 8)  # (volumes, slices, channels, H, W)
    expected = torch.stack([block(x[:, t]) for t in range(5)], dim=1)
    keys = {k: v.clone() for k, v in block.state_dict().items()}
    assert not takes_slices(block)
    assert slice_wise(block) == 3
    assert takes_slices(block) and isinstance(block[0], SliceConv2d)
    assert isinstance(block[2], SliceGroupNorm)
    assert block.state_dict().keys() == keys.keys()  # same parameters, same names
    out = block(x)
    assert out.shape == (3, 5, 4, 4, 4)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(per_slice(block, x, fold=False), expected)  # one call
    torch.testing.assert_close(block(x[:, 0]), expected[:, 0])  # 4D input: the 2D layer


def test_a_convlstm_of_slice_wise_layers_computes_the_same_function():
    torch.manual_seed(0)
    model = ConvLSTMClassifier3D(widths=(4, 4, 4, 4)).eval()
    x = torch.randn(2, 1, 3, 16, 16)
    folded = model(x)
    for module in [m for m in model.modules() if hasattr(m, "fold_slices")]:
        module.fold_slices = False
        slice_wise(module)
    torch.testing.assert_close(model(x), folded)
