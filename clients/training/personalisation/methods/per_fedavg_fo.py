"""``per-fedavg-fo``: Per-FedAvg's first-order local steps (Fallah, Mokhtari, Ozdaglar 2020).

Each local step takes the gradient at ``w - inner_lr grad f(w)``
(:func:`clients.training.personalisation.per_fedavg_fo.per_fedavg_fo_steps`); the
personalised model is the global one after ``finetune-steps`` plain gradient
steps of size ``inner-lr`` (the paper's alpha).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import nn

from clients.site.instruction import SiteRunSettings
from clients.training.personalisation.methods.finetune import FineTune
from clients.training.personalisation.per_fedavg_fo import per_fedavg_fo_steps
from clients.training.personalisation.site_personalisation import SITE_PERSONALISATION
from clients.training.site_task import SiteTask
from clients.training.trainer import TrainResult

__all__ = ["PerFedAvgFO"]


@SITE_PERSONALISATION.register("per-fedavg-fo")
class PerFedAvgFO(FineTune):
    """Per-FedAvg-FO's local steps; adaptation with gradient steps of ``inner-lr``."""

    def train(self, task: SiteTask, model: nn.Module, steps: int, seed: int,
              deadline: float | None, **train_args: Any) -> TrainResult:
        """``steps`` Per-FedAvg-FO steps (the outer step is the run's SGD with ``lr``)."""
        return task.train(model, steps=steps, seed=seed, deadline=deadline,
                          loop=partial(per_fedavg_fo_steps, inner_lr=self.options.inner_lr),
                          **train_args)

    def adaptation_step(self, run: SiteRunSettings) -> tuple[float, float]:
        """Fallah et al.: gradient steps of size alpha (``inner-lr``), no momentum."""
        return self.options.inner_lr, 0.0
