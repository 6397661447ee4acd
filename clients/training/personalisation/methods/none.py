"""``none``: the site trains the global model and keeps nothing of its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from torch import nn

from clients.site.instruction import SiteRunSettings
from clients.training.personalisation.site_personalisation import (SITE_PERSONALISATION,
                                                                   Adaptation)
from clients.training.private_training import DpSettings
from clients.training.site_task import SiteTask
from clients.training.trainer import ComputeDevice, TrainResult
from strategies.wire.personalisation_options import PersonalisationOptions

__all__ = ["NoPersonalisation"]


@SITE_PERSONALISATION.register("none")
class NoPersonalisation:
    """The global model only; the base the other methods change one step of.

    Parameters
    ----------
    options : PersonalisationOptions
        The run's ``personalisation.*`` section.
    state_dir : Path or None
        The site's state dir (None: the site keeps nothing, as in ``make predict``).
    federation : str
        The federation the site's state is keyed by ("": none).
    """

    keeps_layers: ClassVar[bool] = False

    def __init__(self, options: PersonalisationOptions, state_dir: Path | None,
                 federation: str) -> None:
        self.options = options

    @classmethod
    def check_model(cls, model: nn.Module, task: str) -> None:
        """Any model."""

    def receive(self, model: nn.Module) -> None:
        """The received model as it is."""

    def train(self, task: SiteTask, model: nn.Module, steps: int, seed: int,
              deadline: float | None, **train_args: Any) -> TrainResult:
        """:meth:`SiteTask.train` for ``steps`` steps (the run's optimiser)."""
        return task.train(model, steps=steps, seed=seed, deadline=deadline, **train_args)

    def keep_local(self, model: nn.Module, delta: list[np.ndarray], names: list[str],
                   save: bool = True) -> list[np.ndarray]:
        """``delta``: the site keeps nothing."""
        return delta

    def adaptation_steps(self) -> int:
        """0: nothing trains at evaluation."""
        return 0

    def adapt(self, task: SiteTask | None, model: nn.Module, compute: ComputeDevice,
              run: SiteRunSettings, site_name: str, server_round: int,
              privacy: DpSettings | None = None) -> Adaptation | None:
        """None: there is no personalised model."""
        return None

    def personalised(self, task: SiteTask | None, model: nn.Module, compute: ComputeDevice,
                     run: SiteRunSettings, site_name: str,
                     server_round: int) -> nn.Module | None:
        """:meth:`adapt`'s model, without DP-SGD (for the hospital's own use), or ``None``."""
        adapted = self.adapt(task, model, compute, run, site_name, server_round)
        return None if adapted is None else adapted.model
