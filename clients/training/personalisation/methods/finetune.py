"""``finetune``: trains as FedAvg; the personalised model is the global one adapted k steps.

"FedAvg with one update" of Xia & Cui 2022: the site takes
``personalisation.finetune-steps`` local steps of the run's optimiser from the
global model on its training data, seeded by the run's ``seed``, the round and
the site's name (:func:`strategies.seeds.site_seed` of ``adapt:<name>``), so the
same three give the same model (``make predict PERSONAL=...`` relies on it).
"""

from __future__ import annotations

import copy

from torch import nn

from clients.site.run_settings import SiteRunSettings
from clients.training.device import ComputeDevice
from clients.training.personalisation.methods.none import NoPersonalisation
from clients.training.personalisation.site_personalisation import SITE_PERSONALISATION
from clients.training.site_task import SiteTask
from strategies.seeds import site_seed

__all__ = ["FineTune"]


@SITE_PERSONALISATION.register("finetune")
class FineTune(NoPersonalisation):
    """Adapts a copy of the global model at evaluation; trains as ``none``."""

    def adaptation_step(self, run: SiteRunSettings) -> tuple[float, float]:
        """The adaptation's learning rate and momentum: the run's."""
        return run.lr, run.momentum

    def personalised(self, task: SiteTask | None, model: nn.Module, compute: ComputeDevice,
                     run: SiteRunSettings, site_name: str,
                     server_round: int) -> nn.Module | None:
        """``model`` after ``finetune-steps`` steps on the site's training data (a copy).

        None at a site without training data (or without its task).
        """
        if task is None or task.train_set is None or not len(task.train_set):
            return None
        personal = copy.deepcopy(model)
        lr, momentum = self.adaptation_step(run)
        task.train(personal, steps=self.options.finetune_steps, lr=lr, momentum=momentum,
                   compute=compute, seed=site_seed(run.seed, server_round, f"adapt:{site_name}"),
                   optimizer=run.optimizer, label=f"{site_name} adapt")
        return personal
