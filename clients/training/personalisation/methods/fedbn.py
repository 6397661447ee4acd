"""``fedbn``: the site keeps its normalisation layers (Li et al., "FedBN", ICLR 2021).

They are put back onto every received model (train and evaluate), saved after
training in the site's state dir (:class:`~clients.training.personalisation.local_layers.LocalLayers`),
and their update entries are 0: their values never leave the site. The
personalised model is the global one with those layers.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
from torch import nn

from clients.site.instruction import SiteRunSettings
from clients.site.state_store import SiteStateStore
from clients.training.trainer import ComputeDevice
from clients.training.personalisation.local_layers import LocalLayers, local_state_names
from clients.training.personalisation.methods.none import NoPersonalisation
from clients.training.personalisation.site_personalisation import (SITE_PERSONALISATION,
                                                                   Adaptation)
from clients.training.private_training import DpSettings
from clients.training.site_task import SiteTask
from strategies.wire.personalisation_options import CHOICE_KEY, PersonalisationOptions
from strategies.wire.plugin_options import PluginError

__all__ = ["FedBN"]


@SITE_PERSONALISATION.register("fedbn")
class FedBN(NoPersonalisation):
    """The site's own normalisation layers (none kept when the message names no federation)."""

    keeps_layers = True

    def __init__(self, options: PersonalisationOptions, state_dir: Path | None,
                 federation: str) -> None:
        super().__init__(options, state_dir, federation)
        self.layers = (LocalLayers(SiteStateStore(state_dir), federation)
                       if state_dir is not None and federation else None)

    @classmethod
    def check_model(cls, model: nn.Module, task: str) -> None:
        """Refuse a model whose normalisation layers hold nothing to keep.

        Raises
        ------
        PluginError
            Naming ``personalisation.method`` and the task.
        """
        if not local_state_names(model):
            raise PluginError(f"run config key '{CHOICE_KEY}' = 'fedbn' needs a model with "
                              f"normalisation layers that hold parameters or statistics; task "
                              f"{task!r}'s model has none")

    def receive(self, model: nn.Module) -> None:
        """Put the site's own layers onto the received global model."""
        if self.layers is not None:
            self.layers.restore(model)

    def keep_local(self, model: nn.Module, delta: list[np.ndarray], names: list[str],
                   save: bool = True) -> list[np.ndarray]:
        """Save the trained layers and send 0 in their place.

        ``save = False`` (the end-of-federation fine-tuning of the cross-site matrix,
        a round after the last) sends the 0s but keeps the saved layers as they
        are: the site's personalised model stays the one its test metric was
        reported for.
        """
        if self.layers is None:
            return delta
        if save:
            self.layers.keep(model)
        local = set(local_state_names(model))
        return [np.zeros_like(d) if name in local else d for name, d in zip(names, delta)]

    def adapt(self, task: SiteTask | None, model: nn.Module, compute: ComputeDevice,
              run: SiteRunSettings, site_name: str, server_round: int,
              privacy: DpSettings | None = None) -> Adaptation | None:
        """``model`` with the site's saved layers (a copy; nothing trains); None before its
        first training."""
        if self.layers is None:
            return None
        personal = copy.deepcopy(model)
        return Adaptation(personal) if self.layers.restore(personal) else None
