"""A network cut into the parts of split learning: site bottom, coordinator middle, site head.

Split learning (Vepakomma et al., "Split learning for health: distributed deep
learning without sharing raw patient data", arXiv:1812.00564, 2018, SplitNN)
cuts a network at a *cut layer*: a site computes the first blocks and sends
the activations at the cut; the coordinator computes the rest. In the *vanilla*
configuration the coordinator finishes the pass (it needs the labels); in the
*U-shaped* configuration (the same paper, "no label sharing") the last blocks go
back to the site, which keeps its labels and computes the loss.

The network must be a sequence of blocks: ``f(x) = b_{n-1}( ... b_1(b_0(x)))``.
:func:`network_blocks` flattens the product's networks into that list (MONAI's
DenseNet: its ``features`` children then its ``class_layers`` children, see
:mod:`models.cxr_densenet`; an ``nn.Sequential``: its children, nested ones
flattened); :func:`split_network` cuts it. The parts share the network's own
modules: no weight is copied, so ``head(middle(bottom(x)))`` is the network. A part
that starts with an in-place activation (DenseNet's ``relu0``) gets it out of place:
it would otherwise overwrite the received activation, a leaf of the autograd graph.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from models.monai_core import DenseNet

__all__ = ["SplitNetwork", "network_blocks", "split_network", "buffers_kept", "CUT_KEY",
           "HEAD_LAYERS_KEY"]

#: Run-config keys named in the errors of :func:`split_network`.
CUT_KEY = "vertical.cut"
HEAD_LAYERS_KEY = "vertical.head-layers"


def _sequential_blocks(model: nn.Sequential) -> list[nn.Module]:
    """The children of a ``nn.Sequential``, nested plain sequentials flattened (a subclass, such
    as MONAI's dense block, may have its own forward: it stays one block)."""
    blocks: list[nn.Module] = []
    for child in model.children():
        blocks += _sequential_blocks(child) if type(child) is nn.Sequential else [child]
    return blocks


def _densenet_blocks(model: DenseNet) -> list[nn.Module]:
    """MONAI's DenseNet: ``forward(x) = class_layers(features(x))``."""
    return _sequential_blocks(model.features) + _sequential_blocks(model.class_layers)


#: How each kind of network is flattened into blocks (the most specific type first).
BLOCK_READERS: dict[type, Callable[[nn.Module], list[nn.Module]]] = {
    DenseNet: _densenet_blocks,
    nn.Sequential: _sequential_blocks,
}


def network_blocks(model: nn.Module) -> list[nn.Module]:
    """The network as its ordered list of blocks (the network's own modules).

    Raises
    ------
    ValueError
        If the network is of no kind of :data:`BLOCK_READERS` (its forward is not
        known to be a sequence of blocks).
    """
    for kind, read in BLOCK_READERS.items():
        if isinstance(model, kind):
            return read(model)
    raise ValueError(f"{type(model).__name__} cannot be split: split learning knows the blocks of "
                     f"{', '.join(kind.__name__ for kind in BLOCK_READERS)}")


@dataclass
class SplitNetwork:
    """The parts of a cut network.

    Attributes
    ----------
    bottom : nn.Sequential
        The site's first blocks, up to the cut: ``a1 = bottom(x)``.
    middle : nn.Sequential
        The coordinator's blocks: the rest of the network (vanilla) or all but the
        head (U-shaped): ``a2 = middle(a1)``.
    head : nn.Sequential
        The site's last blocks in the U-shaped configuration (empty in the vanilla one,
        where it is the identity): ``logits = head(a2)``.
    """

    bottom: nn.Sequential
    middle: nn.Sequential
    head: nn.Sequential

    @property
    def u_shaped(self) -> bool:
        """Whether the last blocks (and the labels) stay at the site."""
        return len(self.head) > 0

    def site_part(self) -> nn.ModuleDict:
        """The blocks a site holds, by part name (``bottom``, and ``head`` when U-shaped)."""
        parts = {"bottom": self.bottom}
        if self.u_shaped:
            parts["head"] = self.head
        return nn.ModuleDict(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The whole network, part after part: ``head(middle(bottom(x)))``."""
        return self.head(self.middle(self.bottom(x)))


def split_network(model: nn.Module, cut: int, head_layers: int = 0) -> SplitNetwork:
    """Cut ``model`` after its first ``cut`` blocks; keep its last ``head_layers`` at the site.

    Parameters
    ----------
    model : nn.Module
        A network :func:`network_blocks` reads (its modules are shared, not copied).
    cut : int
        Blocks at the site before the cut (``vertical.cut``): 1 .. n - 1 - head_layers,
        so that the coordinator holds at least one block.
    head_layers : int
        Last blocks kept at the site (``vertical.head-layers``): 0 for the vanilla
        SplitNN, >= 1 for the U-shaped one.

    Raises
    ------
    ValueError
        Naming ``vertical.cut`` or ``vertical.head-layers``, the value and the range
        this network allows.
    """
    blocks = network_blocks(model)
    n = len(blocks)
    if not 0 <= head_layers <= n - 2:
        raise ValueError(f"{HEAD_LAYERS_KEY} = {head_layers}: this {type(model).__name__} has {n} "
                         f"blocks; between 0 and {n - 2} may stay at the site")
    if not 1 <= cut <= n - 1 - head_layers:
        raise ValueError(f"{CUT_KEY} = {cut}: this {type(model).__name__} has {n} blocks"
                         f" ({head_layers} kept as the site's head): the cut must leave 1 to "
                         f"{n - 1 - head_layers} blocks at the site and one at the coordinator")
    for first in (blocks[cut], blocks[n - head_layers] if head_layers else None):
        if getattr(first, "inplace", False):
            first.inplace = False
    return SplitNetwork(bottom=nn.Sequential(*blocks[:cut]),
                        middle=nn.Sequential(*blocks[cut:n - head_layers]),
                        head=nn.Sequential(*blocks[n - head_layers:]))


@contextmanager
def buffers_kept(module: nn.Module) -> Iterator[nn.Module]:
    """Run a recomputed forward pass without counting it twice: the module's buffers
    (BatchNorm's running statistics and batch counter) are restored on exit."""
    saved = {name: buffer.clone() for name, buffer in module.named_buffers()}
    try:
        yield module
    finally:
        with torch.no_grad():
            for name, buffer in module.named_buffers():
                buffer.copy_(saved[name])
