"""DenseNet-121 for chest X-ray classification (one logit per label).

DenseNet (Huang et al., "Densely connected convolutional networks", CVPR 2017)
connects every layer of a dense block to all earlier ones, so features are
reused and the network is accurate for its size. CheXNet (Rajpurkar et al.,
"CheXNet: radiologist-level pneumonia detection on chest X-rays with deep
learning", arXiv:1711.05225, 2017) is a DenseNet-121 on 224 x 224 frontal
radiographs with one sigmoid output per finding (14 for ChestX-ray14),
trained with binary cross-entropy. This module builds that network with MONAI
(:class:`monai.networks.nets.DenseNet121`, ``spatial_dims=2``) and a small
DenseNet of the same design for CPU demos and tests.

The outputs are logits: train with ``torch.nn.BCEWithLogitsLoss`` (binary or
multi-label) and read probabilities with ``torch.sigmoid``, label by label.
"""

from __future__ import annotations

import torch
from torch import nn

from models.monai_core import DenseNet, DenseNet121

__all__ = ["make_cxr_densenet", "SMALL_CONFIG"]

#: The ``small=True`` network: 3 dense blocks of 2, 4, 4 layers, 16 initial features, growth 16.
SMALL_CONFIG = {"init_features": 16, "growth_rate": 16, "block_config": (2, 4, 4)}
_FIRST_CONV = "features.conv0.weight"


def make_cxr_densenet(
    num_labels: int = 1, in_channels: int = 1, pretrained: bool = False, small: bool = False
) -> nn.Module:
    """Build a 2D DenseNet that maps radiographs to one logit per label.

    Parameters
    ----------
    num_labels : int
        Number of outputs: 1 for a binary task (e.g. pneumothorax vs none), L
        for L independent findings (multi-label, a sigmoid per label).
    in_channels : int
        Image channels; 1 for grayscale radiographs.
    pretrained : bool
        Start DenseNet-121 from the ImageNet weights of torchvision (downloaded
        by MONAI through ``torch.hub``; needs network access or a filled hub
        cache). The first convolution is adapted to ``in_channels`` by summing
        its RGB filters and spreading them over the input channels, so a grey
        image gives the response the RGB network gives to that image
        replicated on 3 channels; the classifier is new. ImageNet-pretrained
        inputs are best standardised (grey mean 0.449, std 0.226).
    small : bool
        Build the small DenseNet (:data:`SMALL_CONFIG`, ~0.1 M parameters
        instead of ~7 M) for CPU demos and tests; same structure (stem, dense
        blocks with bottleneck layers, transitions, global pooling, linear head).

    Returns
    -------
    nn.Module
        Maps ``(B, in_channels, H, W)`` to logits ``(B, num_labels)``. Any
        ``H, W >= 32`` works (global average pooling before the head).

    Raises
    ------
    ValueError
        If ``num_labels`` or ``in_channels`` is < 1, or ``pretrained`` and
        ``small`` are both set (there are no pretrained small weights).
    """
    if num_labels < 1:
        raise ValueError(f"num_labels must be >= 1, got {num_labels}")
    if in_channels < 1:
        raise ValueError(f"in_channels must be >= 1, got {in_channels}")
    if small:
        if pretrained:
            raise ValueError("there are no pretrained weights for the small DenseNet; use small=False")
        return DenseNet(spatial_dims=2, in_channels=in_channels, out_channels=num_labels, **SMALL_CONFIG)
    if not pretrained or in_channels == 3:
        return DenseNet121(spatial_dims=2, in_channels=in_channels, out_channels=num_labels, pretrained=pretrained)
    rgb = DenseNet121(spatial_dims=2, in_channels=3, out_channels=num_labels, pretrained=True)
    net = DenseNet121(spatial_dims=2, in_channels=in_channels, out_channels=num_labels)
    state = rgb.state_dict()
    rgb_filters = state[_FIRST_CONV]
    state[_FIRST_CONV] = rgb_filters.sum(dim=1, keepdim=True).repeat(1, in_channels, 1, 1) / in_channels
    with torch.no_grad():
        net.load_state_dict(state)
    return net
