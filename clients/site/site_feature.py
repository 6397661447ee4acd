"""The seam of a site's round and the table of its features: a :class:`SiteFeature`, its
hooks, and which features a message turns on.

The site's round (:mod:`clients.site.site_round`) does what every round does: reads the
global model, trains tau local steps, computes ``delta = x_global - x_local``, encodes it
with the round's codec and error feedback, and reports the round's metrics. Everything a
run may add to that is a feature that reaches into the round only through the hooks of
:class:`SiteFeature`, called in the order of the round's active features
(:func:`round_features`: a feature that is off is not built, so none of its hooks runs):

1. what it receives: :meth:`~SiteFeature.receive` the instruction's arrays (its own entries
   taken off, or the packed model they stand for), then :meth:`~SiteFeature.received` the
   global model by name; an evaluate or query message runs :meth:`~SiteFeature.evaluated`'s
   network;
2. the training it changes: :meth:`~SiteFeature.model_args` of the network built, then
   :meth:`~SiteFeature.training`, a context around the local steps that may change what
   trains (:class:`LocalTraining`: the network, the trainer, its arguments, step hooks)
   and record what they did on the way out;
3. what it does to the update: :meth:`~SiteFeature.outgoing` on ``delta`` by name,
   :meth:`~SiteFeature.residual_name` of its error-feedback residual, or
   :meth:`~SiteFeature.seal` when it encodes the update itself;
4. what it reports: :meth:`~SiteFeature.reply`'s arrays next to the update and
   :meth:`~SiteFeature.metrics` in the reply's metrics.

A feature's part of the instruction (its config entries, typed) is an
:class:`InstructionPart` of its own file, read by
:meth:`clients.site.instruction.Instruction.parse` over :data:`INSTRUCTION_PARTS`.

**The table.** This module is the one place that names every feature: the site's round
and its instruction (:mod:`clients.site.instruction`) iterate over :data:`FEATURES` and
:data:`INSTRUCTION_PARTS` and name none. Each feature's file implements the seam above, so
the table is built on its first use, once this module has loaded. :data:`FEATURES` is also
the order in which the hooks run, and it matters where two features meet:

* SCAFFOLD's ``outgoing`` reads ``x - y`` before personalisation zeroes the site's own
  layers in it and pruning compacts it;
* personalisation prepares the received model before pruning cuts it (and a structured
  round is refused at a site that keeps its own layers);
* pruning takes its mask entries off and saves the mask before the downlink step is
  applied and saved;
* the DP charge is opened last before the steps and recorded first after them, so
  nothing that may still refuse the round runs between the charge and the training.

Whether a feature is on is decided here, from data, before its file is entered: each
factory is called only when its :class:`FeatureGate` opens (the message's kind, the
instruction part it needs present, a run setting read as an attribute); the factory may
still find the feature off (a part whose entries ask nothing of it).

SecAgg+'s :class:`~clients.site.secure_update.SecureMasking` is not among them: the
collect stage builds it with the site's participant (:mod:`clients.site.secure_round`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
from torch import nn

from clients.site.site_reply import Metrics
from clients.training.trainer import StepHooks, TrainResult
from strategies.wire.errors import ConfigError

if TYPE_CHECKING:  # the instruction reads the features' parts: imported for annotations only
    from typing import Self

    from clients.site.instruction import Instruction, SiteRunSettings
    from clients.site.site import Site
    from clients.training.site_task import SiteTask

__all__ = ["FEATURES", "INSTRUCTION_PARTS", "RESIDUAL_NAME", "FeatureFactory", "FeatureGate",
           "InstructionPart", "LocalTraining", "LocalUpdate", "SiteFeature", "StepHookChain",
           "config_value", "round_features"]

#: The error-feedback residual's name in the site's state store.
RESIDUAL_NAME = "ef-residual"

#: ``trainer(task, network, steps, seed, deadline, **train_args)``: the round's local steps
#: (:meth:`clients.training.site_task.SiteTask.train`'s arguments).
Trainer = Callable[..., TrainResult]


def config_value(config: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    """``config[key]`` as ``kind`` (``default`` when absent), naming the key when it is not.

    Raises
    ------
    ConfigError
        When ``key`` is absent and ``default`` is ``None``, or its value is not a ``kind``.
    """
    if key not in config:
        if default is None:
            raise ConfigError(f"instruction key {key!r} is missing; request refused")
        return default
    try:
        return kind(config[key])
    except (TypeError, ValueError):
        raise ConfigError(f"instruction key {key!r} = {config[key]!r} is not a "
                          f"{kind.__name__}; request refused") from None


class InstructionPart(Protocol):
    """A feature's entries of an instruction's config record, typed.

    A frozen dataclass whose fields' defaults are what an instruction without those entries
    means; its fields read as the :class:`~clients.site.instruction.Instruction`'s
    attributes (``instruction.<field>``).

    :attr:`KEYS` declares the config entries the part reads: the instruction calls
    :meth:`from_config` only for a message that carries one of them, so that a message
    without them does not enter the feature's file.
    """

    #: The config entries this part reads (:mod:`strategies.wire.message_keys`).
    KEYS: ClassVar[frozenset[str]]

    @classmethod
    def from_config(cls, kind: str, config: Mapping[str, Any]) -> Self | None:
        """The part of a ``kind`` message whose config record is ``config``; ``None`` when
        it carries none of the part's entries.

        Raises
        ------
        ConfigError
            Naming the entry, for a value of the wrong type or outside its choices.
        """


@dataclass
class LocalTraining:
    """One round's local training, as the features see and change it.

    Attributes
    ----------
    task, instruction, site, run
        The round's task, instruction, site and run settings.
    steps : int
        The steps the round asks (tau, capped by the site).
    lr : float
        The round's learning rate (``lr-schedule``).
    final : bool
        A train message after the run's last round (the cross-site matrix's fine-tune).
    global_arrays : dict of str to numpy.ndarray
        The global model by name, in the model's order.
    model : nn.Module
        The dense network holding the global model; it holds the trained weights after
        the features' :meth:`SiteFeature.training` contexts closed.
    parameters : frozenset of str
        The names of ``model``'s parameters (the others are buffers).
    network : nn.Module
        What the steps train (``model`` unless a feature trains another network).
    trainer : callable or None
        What runs the steps; ``None``: :meth:`SiteTask.train`.
    train_args : dict
        The trainer's keyword arguments a feature adds.
    step_hooks : list of StepHooks
        What runs around every optimiser step, in the features' order.
    result : TrainResult or None
        The steps' outcome, once they ran.
    """

    task: SiteTask
    instruction: Instruction
    site: Site
    run: SiteRunSettings
    steps: int
    lr: float
    final: bool
    global_arrays: dict[str, np.ndarray]
    model: nn.Module
    parameters: frozenset[str]
    network: nn.Module
    trainer: Trainer | None = None
    train_args: dict[str, Any] = field(default_factory=dict)
    step_hooks: list[StepHooks] = field(default_factory=list)
    result: TrainResult | None = None


@dataclass(frozen=True)
class LocalUpdate:
    """One round's local training at a site, before its update is encoded or sealed.

    Attributes
    ----------
    delta : list of numpy.ndarray
        ``x_global - x_local`` in the global model's order and dtypes, as the features'
        :meth:`SiteFeature.outgoing` left it.
    buffers : frozenset of int
        Positions of the model's buffers (normalisation statistics, counters).
    metrics : dict
        The train reply's metrics but the codec's (``residual-norm``).
    """

    delta: list[np.ndarray]
    buffers: frozenset[int]
    metrics: Metrics


class StepHookChain:
    """Several features' step hooks run as one, in order."""

    def __init__(self, hooks: Sequence[StepHooks]) -> None:
        self.hooks = list(hooks)

    def before_step(self, model: nn.Module) -> None:
        """Each feature's ``before_step``."""
        for hooks in self.hooks:
            hooks.before_step(model)

    def after_step(self, model: nn.Module) -> None:
        """Each feature's ``after_step``."""
        for hooks in self.hooks:
            hooks.after_step(model)


class SiteFeature(Protocol):
    """One optional behaviour of a site's round, reaching into it only through these hooks.

    A feature class subclasses this Protocol explicitly and overrides the hooks it needs;
    the others are the defaults here, which change nothing. Hooks run in the order of the
    round's active features (:data:`FEATURES`).
    """

    def receive(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The instruction's arrays as this feature passes them on: its own entries taken off
        (and kept for its later hooks), or the packed model (:mod:`strategies.wire.model_layout`)
        that its entries stand for.

        Raises
        ------
        SiteError, FedMedError
            When the feature's entries are missing, malformed or do not apply to what the
            site holds.
        """
        return arrays

    def received(self, model: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The global model by name as this feature passes it on (in full shapes)."""
        return model

    def evaluated(self, network: nn.Module, task: SiteTask) -> nn.Module:
        """The network an evaluate or query message runs, from ``network`` holding the
        received global model."""
        return network

    def model_args(self) -> dict[str, Any]:
        """Keyword arguments of the trained network's build (:meth:`SiteTask.build_model`)."""
        return {}

    def training(self, local: LocalTraining) -> AbstractContextManager[None]:
        """A context around the round's local steps.

        On entry it may refuse the round (raising) or change ``local`` (the network, the
        trainer and its arguments, step hooks); on a normal exit it records what the steps
        did (``local.result``) and leaves the trained weights on ``local.model``. When the
        steps fail it releases what it reserved and lets the error pass.
        """
        return nullcontext()

    def outgoing(self, delta: dict[str, np.ndarray], local: LocalTraining
                 ) -> dict[str, np.ndarray]:
        """The update as this feature passes it on (``delta`` by name, model order): read,
        zeroed where the site keeps values, or compacted."""
        return delta

    def residual_name(self, name: str) -> str:
        """The state-store name of the update's error-feedback residual, from ``name``."""
        return name

    def seal(self, update: LocalUpdate) -> dict[str, np.ndarray] | None:
        """The arrays to send when this feature encodes the update itself; ``None``: the
        round's codec. A sealed update leaves alone: no other feature's :meth:`reply` and no
        ``residual-norm`` join it (they would reveal what the seal hides)."""
        return None

    def reply(self) -> dict[str, np.ndarray]:
        """Arrays the reply carries next to the update."""
        return {}

    def metrics(self) -> Metrics:
        """The reply's metrics this feature adds."""
        return {}


class FeatureFactory(Protocol):
    """Builds a feature for one message, or ``None`` when it is off for it."""

    def __call__(self, instruction: Instruction, site: Site,
                 run: SiteRunSettings) -> SiteFeature | None:
        """The feature for ``instruction`` at ``site`` under ``run``; ``None``: off."""


@dataclass(frozen=True)
class FeatureGate:
    """A feature's factory and what must hold before it is called (none of it in the
    feature's file: a feature that is off is not entered).

    Attributes
    ----------
    factory : FeatureFactory
        Builds the feature, or ``None`` when it is off after all.
    kinds : frozenset of str or None
        The message kinds it serves; ``None``: every kind.
    part : type of InstructionPart or None
        The instruction part it needs present; ``None``: none.
    run_on : callable or None
        ``run_on(run)``, a test of the run's settings (of this file) that it needs;
        ``None``: none.
    """

    factory: FeatureFactory
    kinds: frozenset[str] | None = None
    part: type[InstructionPart] | None = None
    run_on: Callable[[SiteRunSettings], bool] | None = None

    def opens(self, instruction: Instruction, run: SiteRunSettings) -> bool:
        """Whether the factory is called for ``instruction`` under ``run``."""
        return ((self.kinds is None or instruction.kind in self.kinds)
                and (self.part is None or instruction.part(self.part) is not None)
                and (self.run_on is None or self.run_on(run)))


def _dp_sgd(run: SiteRunSettings) -> bool:
    """A run whose local training is DP-SGD."""
    return run.dp_sgd


_TRAIN = frozenset({"train"})

#: The features' parts of an instruction, in the order they are read.
INSTRUCTION_PARTS: tuple[type[InstructionPart], ...]
#: The features of a site's round, in hook order.
FEATURES: tuple[FeatureGate, ...]


@cache
def _table() -> tuple[tuple[type[InstructionPart], ...], tuple[FeatureGate, ...]]:
    """:data:`INSTRUCTION_PARTS` and :data:`FEATURES`, built once, on first use: each
    feature's file imports the seam above, which must have loaded first."""
    from clients.site.last_global import DownlinkInstruction, DownlinkReceive
    from clients.site.privacy_charge import PrivateTraining
    from clients.site.secure_update import SecureInstruction
    from clients.site.site_pruning import PruningInstruction, SitePruning
    from clients.site.site_scaffold import ControlInstruction, SiteScaffold
    from clients.training.personalisation.site_personalisation import (NO_PERSONALISATION,
                                                                       PersonalisedTraining)

    def personalised(run: SiteRunSettings) -> bool:
        """A run with a personalisation method other than ``none``."""
        return run.personalisation.method != NO_PERSONALISATION

    parts = (DownlinkInstruction, ControlInstruction, SecureInstruction, PruningInstruction)
    features = (
        FeatureGate(SiteScaffold.of, _TRAIN, part=ControlInstruction),
        FeatureGate(PersonalisedTraining.of, _TRAIN, run_on=personalised),
        FeatureGate(SitePruning.of, part=PruningInstruction),
        FeatureGate(DownlinkReceive.of, part=DownlinkInstruction),
        FeatureGate(PrivateTraining.of, _TRAIN, run_on=_dp_sgd),
    )
    return parts, features


def __getattr__(name: str) -> Any:
    """:data:`INSTRUCTION_PARTS` and :data:`FEATURES`, from the table (:func:`_table`)."""
    if name == "INSTRUCTION_PARTS":
        return _table()[0]
    if name == "FEATURES":
        return _table()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def round_features(instruction: Instruction, site: Site,
                   run: SiteRunSettings) -> list[SiteFeature]:
    """The features active for ``instruction`` at ``site`` under ``run``, in hook order; one
    that is off is not built, and its file is not entered when its gate stays shut."""
    return [feature for feature in (gate.factory(instruction, site, run) for gate in _table()[1]
                                    if gate.opens(instruction, run))
            if feature is not None]
