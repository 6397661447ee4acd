"""``none``: the site trains the global model and keeps nothing of its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from clients.site.run_settings import SiteRunSettings
from clients.training.device import ComputeDevice
from clients.training.personalisation.site_personalisation import SITE_PERSONALISATION
from clients.training.site_task import SiteTask
from clients.training.trainer import TrainResult
from strategies.plugins.personalisation.gain import PERSONALISED
from strategies.plugins.personalisation.options import PersonalisationOptions

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

    def personalised(self, task: SiteTask | None, model: nn.Module, compute: ComputeDevice,
                     run: SiteRunSettings, site_name: str,
                     server_round: int) -> nn.Module | None:
        """None: there is no personalised model."""
        return None

    def metrics(self, task: SiteTask, model: nn.Module, compute: ComputeDevice, split: str,
                run: SiteRunSettings, site_name: str, server_round: int) -> dict[str, float]:
        """The personalised model's loss and metrics on ``split``, named
        ``personalised-<split>-<name>``; ``model`` (the received one) is left as it is.

        Empty when :meth:`personalised` gives no model and for a split without items.
        """
        personal = self.personalised(task, model, compute, run, site_name, server_round)
        if personal is None:
            return {}
        result = task.evaluate(personal, compute, split=split)
        if not result.num_examples:
            return {}
        values = {"loss": result.loss, **result.metrics}
        return {f"{PERSONALISED}{split}-{name}": value for name, value in values.items()}
