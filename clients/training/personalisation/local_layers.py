"""FedBN's local layers: a site's normalisation layers, kept at the site and never sent.

Li, Jiang, Zhang, Kamp, Dou, "FedBN: federated learning on non-IID features via
local batch normalization", ICLR 2021: each site keeps the affine parameters and
running statistics of its normalisation layers (BatchNorm, InstanceNorm with
affine or running statistics, GroupNorm, LayerNorm); everything else is federated.
The site's values are saved in its state dir, keyed by federation
(``<state-dir>/<federation>/fedbn-local-layers.npy``, one float64 vector in the
model's state-dict order, written atomically by
:class:`~clients.site.state_store.SiteStateStore`), so they survive a SuperNode
restart, and put back onto every received global model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from clients.site.state_store import SiteStateStore
from strategies.wire.errors import SiteError

__all__ = ["LOCAL_LAYERS", "LocalLayers", "LocalLayersError", "NORM_LAYERS", "local_state_names"]

#: The normalisation layers FedBN keeps local.
NORM_LAYERS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm,
               nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d, nn.GroupNorm,
               nn.LayerNorm)
#: Name of the saved vector in the site's state store.
LOCAL_LAYERS = "fedbn-local-layers"


class LocalLayersError(SiteError):
    """The saved local layers do not fit the model (the file is named)."""


def local_state_names(model: nn.Module) -> list[str]:
    """State-dict keys of ``model``'s normalisation layers (parameters and buffers), in order.

    Empty for a model whose normalisation layers hold no state (MONAI's default
    InstanceNorm: no affine, no running statistics).
    """
    local = {f"{prefix}.{key}" if prefix else key
             for prefix, module in model.named_modules() if isinstance(module, NORM_LAYERS)
             for key in module.state_dict()}
    return [name for name in model.state_dict() if name in local]


class LocalLayers:
    """A site's normalisation layers for one federation, in its state dir."""

    def __init__(self, store: SiteStateStore, federation: str) -> None:
        self.store, self.federation = store, federation

    def restore(self, model: nn.Module) -> bool:
        """Put the saved layers onto ``model`` (in place); ``False`` when none is saved yet.

        Raises
        ------
        LocalLayersError
            If the saved vector's size does not match the model's layers.
        """
        saved = self.store.load(self.federation, LOCAL_LAYERS)
        if saved is None:
            return False
        state = model.state_dict()
        names = local_state_names(model)
        sizes = [state[name].numel() for name in names]
        if saved.ndim != 1 or saved.size != sum(sizes):
            raise LocalLayersError(
                f"{self.store.state_dir / self.federation / LOCAL_LAYERS}.npy: {saved.size} "
                f"values saved, the model's normalisation layers have {sum(sizes)}")
        with torch.no_grad():
            for name, part in zip(names, np.split(saved, np.cumsum(sizes)[:-1])):
                target = state[name]
                target.copy_(torch.from_numpy(part.reshape(tuple(target.shape))).to(target.dtype))
        return True

    def keep(self, model: nn.Module) -> Path:
        """Save ``model``'s normalisation layers; returns the file."""
        state = model.state_dict()
        parts = [state[name].detach().cpu().double().numpy().ravel()
                 for name in local_state_names(model)]
        vector = np.concatenate(parts) if parts else np.zeros(0)
        return self.store.save(self.federation, LOCAL_LAYERS, vector)
