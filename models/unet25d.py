"""2.5D U-Net for pulmonary-embolism segmentation on CT.

A 2.5D network sees a slab of ``slab_slices`` consecutive axial slices as input
channels and predicts the segmentation of the centre slice. It keeps most of the
through-plane context of a 3D network at the cost of a 2D one, the usual choice
for thin, elongated targets such as emboli in pulmonary arteries (e.g. the 2.5D
slab inputs of Liu et al., "Evaluation of pulmonary embolism in CTPA with deep
learning", Eur. Radiol. 2020).

The backbone is MONAI's residual U-Net (Kerfoot et al., "Left-ventricle
quantification using residual U-Net", STACOM 2018), used as is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from models.monai_core import UNet

__all__ = ["make_unet25d"]


def make_unet25d(
    slab_slices: int = 9,
    channels: Sequence[int] = (16, 32, 64, 128),
    num_res_units: int = 1,
    dropout: float = 0.0,
    foreground_prior: float = 0.01,
) -> nn.Module:
    """Build the 2.5D U-Net: ``slab_slices`` slices in as channels, one logit map out.

    Parameters
    ----------
    slab_slices : int
        Number of consecutive axial slices stacked as input channels (odd).
    channels : Sequence[int]
        Feature maps per resolution level; each level halves the in-plane size,
        so the input size must be divisible by ``2 ** (len(channels) - 1)``.
    num_res_units : int
        Residual units per level (MONAI ``UNet``).
    dropout : float
        Dropout probability inside the units.
    foreground_prior : float
        Initial foreground probability of every pixel: the output bias starts at
        ``log(pi / (1 - pi))`` (the prior initialisation of Lin et al., "Focal loss
        for dense object detection", ICCV 2017, sec. 4.1), so training does not
        first spend hundreds of steps learning that emboli are rare.

    Returns
    -------
    nn.Module
        Maps ``(B, slab_slices, H, W)`` to centre-slice logits ``(B, 1, H, W)``.
        Apply a sigmoid for probabilities (MONAI ``DiceLoss(sigmoid=True)``).
    """
    if slab_slices < 1 or slab_slices % 2 == 0:
        raise ValueError(f"slab_slices must be odd and >= 1, got {slab_slices}")
    if len(channels) < 2:
        raise ValueError(f"channels needs at least two levels, got {tuple(channels)}")
    if not 0.0 < foreground_prior < 1.0:
        raise ValueError(f"foreground_prior must be in (0, 1), got {foreground_prior}")
    net = UNet(
        spatial_dims=2,
        in_channels=slab_slices,
        out_channels=1,
        channels=tuple(channels),
        strides=(2,) * (len(channels) - 1),
        num_res_units=num_res_units,
        norm="instance",
        dropout=dropout,
    )
    last_conv = [m for m in net.modules() if isinstance(m, nn.Conv2d)][-1]
    with torch.no_grad():
        last_conv.bias.fill_(math.log(foreground_prior / (1.0 - foreground_prior)))
    return net
