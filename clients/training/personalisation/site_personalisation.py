"""A site's personalisation: what it does around training and evaluation (no Flower).

Each method of the run config's ``personalisation.method`` (its server-side rules:
:mod:`strategies.plugins.personalisation`) has a site-side class of the same
name in ``methods/``, registered in :data:`SITE_PERSONALISATION` (the product's
one :class:`~strategies.wire.registry.Registry` type) and meeting
:class:`SitePersonalisation`:

* ``none``: :meth:`SiteTask.train`, the global model only;
* ``finetune``: trains as ``none``; its personalised model is the global model
  adapted ``finetune-steps`` steps of the run's optimiser;
* ``per-fedavg-reptile``: training is
  :func:`~clients.training.personalisation.reptile.reptile_train` (``tau-out`` tasks
  of ``tau-in`` SGD steps, meta step ``alpha``); adapts as ``finetune`` (SGD with ``lr``);
* ``per-fedavg-fo``: the local steps are
  :func:`~clients.training.personalisation.per_fedavg_fo.per_fedavg_fo_steps`
  (``inner-lr``); adapts with plain gradient steps of ``inner-lr``;
* ``fedbn``: the site's normalisation layers are put back onto every received
  model (train and evaluate), saved after training, and their update entries are 0:
  their values never leave the site; its personalised model is the global one
  with those layers.

At evaluation the reply carries the personalised model's metrics as
``personalised-<split>-<metric>`` (:func:`personalised_metrics`); ``make predict
PERSONAL=...`` builds the same model (:meth:`SitePersonalisation.personalised`,
:mod:`app.prediction.personalised`). An adaptation trains on the site's patients, so
in the site's round (:mod:`clients.site.site_adaptation`) it passes the policy's
training rules, runs DP-SGD when the run asks for it (:meth:`SitePersonalisation.adapt`
with ``privacy``) and is charged to the site's privacy ledger; the site's round picks
the method with :func:`site_personalisation`.

In the site's train round a method other than ``none`` is the :class:`PersonalisedTraining`
feature (:class:`~clients.site.site_feature.SiteFeature`): it prepares the received model,
runs the method's local steps and zeroes what the site keeps in the update.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import numpy as np
from torch import nn

from clients.site.site_feature import LocalTraining, SiteFeature
from clients.training.private_training import DpSettings
from clients.training.site_task import SiteTask
from clients.training.trainer import ComputeDevice, TrainResult
from strategies.wire.personalisation_gain import PERSONALISED
from strategies.wire.personalisation_options import CHOICE_KEY, PersonalisationOptions
from strategies.wire.plugin_options import PluginError
from strategies.wire.registry import Registry

if TYPE_CHECKING:
    from clients.site.instruction import Instruction, SiteRunSettings
    from clients.site.site import Site

__all__ = ["NO_PERSONALISATION", "SITE_PERSONALISATION", "Adaptation", "PersonalisedTraining",
           "SitePersonalisation", "personalised_metrics", "require_local_layers",
           "site_personalisation"]

#: The method that trains the global model and keeps nothing (:meth:`SiteTask.train`).
NO_PERSONALISATION = "none"


@dataclass(frozen=True)
class Adaptation:
    """A site's personalised model and the DP-SGD steps its adaptation ran."""

    model: nn.Module
    #: ``(noise multiplier, sample rate, steps)`` rows for the site's ledger; empty when
    #: the adaptation did not train or trained without DP-SGD.
    privacy_steps: tuple[tuple[float, float, int], ...] = ()


@runtime_checkable
class SitePersonalisation(Protocol):
    """One method at one site, for one message (built by :func:`site_personalisation`)."""

    #: Whether the site keeps layers of its own in its state (FedBN's normalisation layers),
    #: whose channels a structured pruning would remove: the site refuses such a round.
    keeps_layers: ClassVar[bool]

    @classmethod
    def check_model(cls, model: nn.Module, task: str) -> None:
        """Refuse (:class:`PluginError`, naming the key and ``task``) a model it cannot serve."""

    def receive(self, model: nn.Module) -> None:
        """Prepare the received global ``model`` before training or evaluation (in place)."""

    def train(self, task: SiteTask, model: nn.Module, steps: int, seed: int,
              deadline: float | None, **train_args: Any) -> TrainResult:
        """The round's local training of ``model``: at most ``steps`` SGD steps in all."""

    def keep_local(self, model: nn.Module, delta: list[np.ndarray], names: list[str],
                   save: bool = True) -> list[np.ndarray]:
        """The update to send: ``delta`` with what the site keeps zeroed (``save``: keep it)."""

    def adaptation_steps(self) -> int:
        """The steps :meth:`adapt` trains on the site's data (0: it does not train)."""

    def adapt(self, task: SiteTask | None, model: nn.Module, compute: ComputeDevice,
              run: SiteRunSettings, site_name: str, server_round: int,
              privacy: DpSettings | None = None) -> Adaptation | None:
        """The site's personalised model of the global ``model`` (a copy), or ``None``.

        A method that adapts on the training data runs ``finetune-steps`` steps, as
        DP-SGD when ``privacy`` is enabled (its steps in the result).
        """

    def personalised(self, task: SiteTask | None, model: nn.Module, compute: ComputeDevice,
                     run: SiteRunSettings, site_name: str,
                     server_round: int) -> nn.Module | None:
        """:meth:`adapt`'s model without DP-SGD (the hospital's own use), or ``None``."""


#: ``(options, state_dir, federation) -> SitePersonalisation``, by method name.
Factory = Callable[[PersonalisationOptions, Path | None, str], SitePersonalisation]

#: The site side of the personalisation methods, discovered from ``methods/``.
SITE_PERSONALISATION: Registry[Factory] = Registry(
    "personalisation method", CHOICE_KEY,
    package="clients.training.personalisation.methods", error=PluginError)


def site_personalisation(options: PersonalisationOptions, state_dir: Path | None,
                         federation: str) -> SitePersonalisation:
    """The run's method at a site with ``state_dir`` in ``federation`` (``""``/None: no state)."""
    return SITE_PERSONALISATION.get(options.method)(options, state_dir, federation)


def require_local_layers(method: str, model: nn.Module, task: str) -> None:
    """Refuse ``method`` for ``model`` before round 1 (FedBN: a model without normalisation state).

    Raises
    ------
    PluginError
        Naming ``personalisation.method`` and the task.
    """
    SITE_PERSONALISATION.get(method).check_model(model, task)


def personalised_metrics(task: SiteTask, personal: nn.Module, compute: ComputeDevice,
                         split: str) -> dict[str, float]:
    """The personalised model's loss and metrics on ``split``, ``personalised-<split>-<name>``.

    Empty for a split without items.
    """
    result = task.evaluate(personal, compute, split=split)
    if not result.num_examples:
        return {}
    values = {"loss": result.loss, **result.metrics}
    return {f"{PERSONALISED}{split}-{name}": value for name, value in values.items()}


class PersonalisedTraining(SiteFeature):
    """The run's personalisation in a site's train round.

    Parameters
    ----------
    personal : SitePersonalisation
        The run's method at the site, for the message's federation.
    """

    def __init__(self, personal: SitePersonalisation) -> None:
        self.personal = personal

    @classmethod
    def of(cls, instruction: Instruction, site: Site,
           run: SiteRunSettings) -> PersonalisedTraining | None:
        """The feature of a train message in a run with a method other than ``none``."""
        if instruction.kind != "train" or run.personalisation.method == NO_PERSONALISATION:
            return None
        return cls(site_personalisation(run.personalisation, site.state_dir,
                                        instruction.federation))

    @contextmanager
    def training(self, local: LocalTraining) -> Iterator[None]:
        """The received model prepared (:meth:`SitePersonalisation.receive`: FedBN's own
        normalisation layers), the method's local steps (:meth:`SitePersonalisation.train`)."""
        self.personal.receive(local.model)
        local.trainer = self.personal.train
        yield

    def outgoing(self, delta: dict[str, np.ndarray], local: LocalTraining
                 ) -> dict[str, np.ndarray]:
        """``delta`` with what the site keeps zeroed (:meth:`SitePersonalisation.keep_local`;
        kept at the site but after the cross-site fine-tune)."""
        names = list(delta)
        kept = self.personal.keep_local(local.model, list(delta.values()), names,
                                        save=not local.final)
        return dict(zip(names, kept))
