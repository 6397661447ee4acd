"""A small convolutional classifier for 28 x 28 single-channel images (e.g. PneumoniaMNIST).

Blocks of ``conv3x3 - [norm] - ReLU - maxpool 2`` followed by a linear head
(optionally one hidden layer), the LeNet-style baseline of MedMNIST-sized
benchmarks (Yang et al., "MedMNIST v2", Sci Data 2023 use ResNets; a few
thousand weights are enough for the binary PneumoniaMNIST task and keep a CPU
federation fast). The benchmarks use two configurations:

* ``SmallCNN((32, 64, 64), norm="bn")``: 56,481 trainable parameters and one
  logit; BatchNorm adds 320 running means/variances and 3 integer
  ``num_batches_tracked`` counters to the ``state_dict``. ``norm="gn"``
  (GroupNorm, 8 groups) has no buffers, so an update is exactly the trainable
  weights.
* ``SmallCNN((8, 16), norm=None, hidden=32, num_outputs=2)``: conv8-pool-
  conv16-pool-fc32-fc2, 26,434 parameters, no normalisation (FedAvg of the
  ``state_dict`` is exact).

Convolutions carry a bias only without normalisation (a norm layer's shift
makes it redundant). Without a hidden layer the head is one ``nn.Linear``
(``state_dict`` keys ``head.weight`` / ``head.bias``, which the wire-size
measurements of ``bench/compression_fedavg.py`` count). Parameters are created in layer order, so under the same
``torch.manual_seed`` a configuration always draws the same initial weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["SmallCNN", "NORMS"]

#: Accepted values of ``norm``: BatchNorm, GroupNorm (8 groups) or none.
NORMS = ("bn", "gn", None)


def _norm_layer(norm: str | None, channels: int) -> list[nn.Module]:
    if norm == "bn":
        return [nn.BatchNorm2d(channels)]
    if norm == "gn":
        return [nn.GroupNorm(8, channels)]
    return []


class SmallCNN(nn.Module):
    """``len(widths)`` conv blocks and a linear head: ``(N, 1, S, S)`` -> ``(N, num_outputs)`` logits.

    Parameters
    ----------
    widths : sequence of int
        Output channels of each ``conv3x3 - [norm] - ReLU - maxpool 2`` block.
    norm : {"bn", "gn", None}
        BatchNorm, GroupNorm with 8 groups (widths must be multiples of 8), or none.
    hidden : int or None
        Width of one hidden fully connected layer (with ReLU) before the output; none if ``None``.
    num_outputs : int
        Logits per image (1 for a binary label with ``BCEWithLogitsLoss``, 2 for cross-entropy).
    image_size : int
        Side of the square input; each block halves it (floor).

    Raises
    ------
    ValueError
        On an unknown ``norm`` or an input too small for the blocks.
    """

    def __init__(self, widths: Sequence[int] = (32, 64, 64), norm: str | None = "bn",
                 hidden: int | None = None, num_outputs: int = 1, image_size: int = 28) -> None:
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
        side = image_size // 2 ** len(widths)
        if side < 1:
            raise ValueError(f"{len(widths)} pooling blocks need images over {2 ** len(widths) - 1} px")
        layers: list[nn.Module] = []
        cin = 1
        for cout in widths:
            layers += [nn.Conv2d(cin, cout, 3, padding=1, bias=norm is None),
                       *_norm_layer(norm, cout), nn.ReLU(), nn.MaxPool2d(2)]
            cin = cout
        self.features = nn.Sequential(*layers)
        flat = cin * side * side
        self.head: nn.Module = (
            nn.Sequential(nn.Linear(flat, hidden), nn.ReLU(), nn.Linear(hidden, num_outputs))
            if hidden else nn.Linear(flat, num_outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(N, num_outputs)`` of images ``(N, 1, S, S)``."""
        return self.head(torch.flatten(self.features(x), 1))
