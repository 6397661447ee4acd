"""``per-fedavg-reptile``: Reptile's tasks and meta steps (Xia & Cui 2022, Algorithm 2).

A round is ``tau-out`` tasks of ``tau-in`` SGD steps, each followed by the meta
step ``w <- w - alpha (w - w_task)``
(:func:`clients.training.personalisation.reptile.reptile_train`); the personalised
model is adapted as ``finetune`` (SGD with ``lr``: the rules require ``optimizer = sgd``).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from clients.training.personalisation.methods.finetune import FineTune
from clients.training.personalisation.reptile import reptile_train
from clients.training.personalisation.site_personalisation import SITE_PERSONALISATION
from clients.training.site_task import SiteTask
from clients.training.trainer import TrainResult

__all__ = ["PerFedAvgReptile"]

#: Spacing of the tasks' seeds (a prime): task ``i`` of a round draws with ``seed + P * i``.
_TASK_SEED_STRIDE = 104_729


@SITE_PERSONALISATION.register("per-fedavg-reptile")
class PerFedAvgReptile(FineTune):
    """Reptile's inner tasks and meta steps; adaptation as ``finetune``."""

    def train(self, task: SiteTask, model: nn.Module, steps: int, seed: int,
              deadline: float | None, **train_args: Any) -> TrainResult:
        """``tau-out`` tasks of ``tau-in`` SGD steps, at most ``steps`` SGD steps in all
        (a cross-site fine-tuning message asks fewer)."""
        opts = self.options

        def inner(index: int, inner_steps: int) -> TrainResult:
            return task.train(model, steps=inner_steps,
                              seed=(seed + _TASK_SEED_STRIDE * index) % 2**31,
                              deadline=deadline, **train_args)

        return reptile_train(model, inner, opts.tau_out, opts.tau_in, opts.alpha, deadline,
                             max_steps=steps)
