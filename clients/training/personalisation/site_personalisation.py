"""A site's personalisation: what it does around training and evaluation (no Flower).

Glue between the run config (``personalisation``, section ``personalisation.*``,
:mod:`strategies.plugins.personalisation`) and the site-side algorithms
(:mod:`clients.training.personalisation`):

* ``per-fedavg-reptile``: training is :func:`~clients.training.personalisation.reptile.reptile_train`
  (``tau-out`` tasks of ``tau-in`` SGD steps, meta step ``alpha``);
* ``per-fedavg-fo``: the local steps are
  :func:`~clients.training.personalisation.per_fedavg_fo.per_fedavg_fo_steps` (``inner-lr``);
* ``fedbn``: the site's normalisation layers are put back onto every received
  model (train and evaluate), saved after training, and their update entries are 0:
  their values never leave the site;
* evaluation: with any method but ``none`` the reply also carries the personalised
  model's metrics as ``personalised-<split>-<metric>`` (and ``personalised-<split>-loss``):
  the global model adapted ``finetune-steps`` local steps on the site's training
  data (``finetune``: the run's optimiser; ``per-fedavg-reptile``: SGD with ``lr``;
  ``per-fedavg-fo``: plain gradient steps of ``inner-lr``), or with the site's own
  layers (``fedbn``): :meth:`SitePersonalisation.personalised`, which ``make predict
  PERSONAL=...`` also uses (:mod:`app.prediction.personalised`).

The site's round (:mod:`clients.site.site_round`) calls it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
from torch import nn

from clients.site.run_settings import SiteRunSettings
from clients.site.state_store import SiteStateStore
from clients.training.device import ComputeDevice
from clients.training.personalisation.local_layers import LocalLayers, local_state_names
from clients.training.personalisation.per_fedavg_fo import per_fedavg_fo_steps
from clients.training.personalisation.reptile import reptile_train
from clients.training.site_task import SiteTask
from clients.training.trainer import TrainResult
from strategies.plugins.options import PluginError
from strategies.plugins.personalisation.gain import PERSONALISED
from strategies.plugins.personalisation.options import CHOICE_KEY, PersonalisationOptions
from strategies.seeds import site_seed

__all__ = ["SitePersonalisation", "require_local_layers"]


def require_local_layers(method: str, model: nn.Module, task: str) -> None:
    """Refuse ``fedbn`` for a model whose normalisation layers hold nothing to keep.

    Raises
    ------
    PluginError
        Naming ``personalisation.method`` and the task.
    """
    if method == "fedbn" and not local_state_names(model):
        raise PluginError(f"run config key '{CHOICE_KEY}' = 'fedbn' needs a model with "
                          f"normalisation layers that hold parameters or statistics; task "
                          f"{task!r}'s model has none")


@dataclass(frozen=True)
class SitePersonalisation:
    """One site's personalisation for one message.

    Attributes
    ----------
    method : str
        The run config's ``personalisation.method``.
    options : PersonalisationOptions
        Its section.
    layers : LocalLayers or None
        FedBN's store of the site's layers; ``None`` for the other methods, or when
        the message names no federation (nothing to key them by).
    """

    method: str
    options: PersonalisationOptions
    layers: LocalLayers | None

    @classmethod
    def of(cls, options: PersonalisationOptions, state_dir: Path,
           federation: str) -> SitePersonalisation:
        """The run's personalisation at a site with ``state_dir`` in ``federation`` ("" = none)."""
        layers = (LocalLayers(SiteStateStore(state_dir), federation)
                  if options.method == "fedbn" and federation else None)
        return cls(options.method, options, layers)

    def receive(self, model: nn.Module) -> None:
        """Put the site's own layers onto the received global model (FedBN)."""
        if self.layers is not None:
            self.layers.restore(model)

    def train(self, task: SiteTask, model: nn.Module, steps: int, seed: int, deadline,
              **train_args) -> TrainResult:
        """Local training: Reptile's tasks, Per-FedAvg-FO's steps, or :meth:`SiteTask.train`'s.

        ``steps`` is what the instruction asks (capped by the site): Reptile runs at most
        that many SGD steps in all (a cross-site fine-tuning message asks fewer).
        """
        opts = self.options
        if self.method == "per-fedavg-fo":
            return task.train(model, steps=steps, seed=seed, deadline=deadline,
                              loop=partial(per_fedavg_fo_steps, inner_lr=opts.inner_lr),
                              **train_args)
        if self.method != "per-fedavg-reptile":
            return task.train(model, steps=steps, seed=seed, deadline=deadline, **train_args)

        def inner(index: int, inner_steps: int) -> TrainResult:
            return task.train(model, steps=inner_steps, seed=(seed + 104_729 * index) % 2**31,
                              deadline=deadline, **train_args)  # optimizer "sgd": the rules

        return reptile_train(model, inner, opts.tau_out, opts.tau_in, opts.alpha, deadline,
                             max_steps=steps)

    def keep_local(self, model: nn.Module, delta: list[np.ndarray], names: list[str],
                   save: bool = True) -> list[np.ndarray]:
        """FedBN: save the trained layers and send 0 in their place; other methods: ``delta``.

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

    def metrics(self, task: SiteTask, model: nn.Module, compute: ComputeDevice, split: str,
                run: SiteRunSettings, site_name: str, server_round: int) -> dict[str, float]:
        """The personalised model's loss and metrics on ``split``, named
        ``personalised-<split>-<name>``; ``model`` (the received one) is left as it is.

        Empty with ``personalisation.method = "none"``, for FedBN before the site's
        first training in this federation, for the adapting methods at a site
        without training data, and for a split without items.
        """
        personal = self.personalised(task, model, compute, run, site_name, server_round)
        if personal is None:
            return {}
        result = task.evaluate(personal, compute, split=split)
        if not result.num_examples:
            return {}
        values = {"loss": result.loss, **result.metrics}
        return {f"{PERSONALISED}{split}-{name}": value for name, value in values.items()}

    def personalised(self, task: SiteTask | None, model: nn.Module, compute: ComputeDevice,
                     run: SiteRunSettings, site_name: str, server_round: int) -> nn.Module | None:
        """The site's personalised model of the global ``model`` (a copy; ``model`` is untouched).

        FedBN: ``model`` with the site's saved layers; the adapting methods: ``model``
        after ``finetune-steps`` local steps on the site's training data, seeded by
        the run's ``seed``, ``server_round`` and ``site_name`` (the same model for
        the same three). ``None`` when there is none (see :meth:`metrics`); FedBN
        needs no ``task``, the adapting methods its training data.
        """
        if self.method == "none":
            return None
        if self.method == "fedbn":
            if self.layers is None:
                return None
            personal = copy.deepcopy(model)
            return personal if self.layers.restore(personal) else None
        if task is None or task.train_set is None or not len(task.train_set):
            return None
        personal = copy.deepcopy(model)
        seed = site_seed(run.seed, server_round, f"adapt:{site_name}")
        lr, momentum, optimizer = run.lr, run.momentum, run.optimizer
        if self.method == "per-fedavg-fo":  # Fallah et al.: gradient steps of size alpha
            lr, momentum = self.options.inner_lr, 0.0
        task.train(personal, steps=self.options.finetune_steps, lr=lr, momentum=momentum,
                   compute=compute, seed=seed, optimizer=optimizer, label=f"{site_name} adapt")
        return personal
