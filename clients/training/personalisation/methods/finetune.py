"""``finetune``: trains as FedAvg; the personalised model is the global one adapted k steps.

"FedAvg with one update" of Xia & Cui 2022: the site takes
``personalisation.finetune-steps`` local steps of the run's optimiser from the
global model on its training data, seeded by the run's ``seed``, the round and
the site's name (:func:`strategies.wire.seeds.site_seed` of ``adapt:<name>``), so the
same three give the same model (``make predict PERSONAL=...`` relies on it).
"""

from __future__ import annotations

import copy

from torch import nn

from clients.site.instruction import SiteRunSettings
from clients.training.trainer import ComputeDevice
from clients.training.personalisation.methods.none import NoPersonalisation
from clients.training.personalisation.site_personalisation import (SITE_PERSONALISATION,
                                                                   Adaptation)
from clients.training.private_training import DpSettings
from clients.training.site_task import SiteTask
from strategies.wire.seeds import site_seed

__all__ = ["FineTune"]


@SITE_PERSONALISATION.register("finetune")
class FineTune(NoPersonalisation):
    """Adapts a copy of the global model at evaluation; trains as ``none``."""

    def adaptation_step(self, run: SiteRunSettings) -> tuple[float, float]:
        """The adaptation's learning rate and momentum: the run's."""
        return run.lr, run.momentum

    def adaptation_steps(self) -> int:
        """``personalisation.finetune-steps``: the adaptation trains on the site's data."""
        return self.options.finetune_steps

    def adapt(self, task: SiteTask | None, model: nn.Module, compute: ComputeDevice,
              run: SiteRunSettings, site_name: str, server_round: int,
              privacy: DpSettings | None = None) -> Adaptation | None:
        """``model`` after ``finetune-steps`` steps on the site's training data (a copy).

        DP-SGD (the same path as training, :meth:`SiteTask.train` with ``privacy``) when
        ``privacy`` is enabled; ``model`` must then be the DP-compatible one. None at a
        site without training data (or without its task).
        """
        if task is None or task.train_set is None or not len(task.train_set):
            return None
        personal = copy.deepcopy(model).train()  # the received model may be in eval mode
        lr, momentum = self.adaptation_step(run)
        result = task.train(personal, steps=self.options.finetune_steps, lr=lr,
                            momentum=momentum, compute=compute,
                            seed=site_seed(run.seed, server_round, f"adapt:{site_name}"),
                            optimizer=run.optimizer, label=f"{site_name} adapt",
                            privacy=privacy)
        return Adaptation(personal, tuple(result.privacy_steps))
