"""The site's round features, in hook order, and the instruction parts they read.

The one place that names every :class:`~clients.site.site_feature.SiteFeature`: the
site's round (:mod:`clients.site.site_training`) and its instruction
(:mod:`clients.site.instruction`) iterate over these and name none.

:data:`FEATURES` is also the order in which the hooks run, and it matters where two
features meet:

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

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from clients.site.last_global import DownlinkInstruction, DownlinkReceive
from clients.site.privacy_charge import PrivateTraining
from clients.site.secure_update import SecureInstruction
from clients.site.site_feature import FeatureFactory, InstructionPart, SiteFeature
from clients.site.site_pruning import PruningInstruction, SitePruning
from clients.site.site_scaffold import ControlInstruction, SiteScaffold
from clients.training.personalisation.site_personalisation import (NO_PERSONALISATION,
                                                                   PersonalisedTraining)

if TYPE_CHECKING:
    from clients.site.instruction import Instruction, SiteRunSettings
    from clients.site.site import Site

__all__ = ["FEATURES", "INSTRUCTION_PARTS", "FeatureGate", "round_features"]

#: The features' parts of an instruction, in the order they are read.
INSTRUCTION_PARTS: tuple[type[InstructionPart], ...] = (
    DownlinkInstruction, ControlInstruction, SecureInstruction, PruningInstruction)


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


def _personalised(run: SiteRunSettings) -> bool:
    """A run with a personalisation method other than ``none``."""
    return run.personalisation.method != NO_PERSONALISATION


def _dp_sgd(run: SiteRunSettings) -> bool:
    """A run whose local training is DP-SGD."""
    return run.dp_sgd


_TRAIN = frozenset({"train"})

#: The features of a site's round, in hook order.
FEATURES: tuple[FeatureGate, ...] = (
    FeatureGate(SiteScaffold.of, _TRAIN, part=ControlInstruction),
    FeatureGate(PersonalisedTraining.of, _TRAIN, run_on=_personalised),
    FeatureGate(SitePruning.of, part=PruningInstruction),
    FeatureGate(DownlinkReceive.of, part=DownlinkInstruction),
    FeatureGate(PrivateTraining.of, _TRAIN, run_on=_dp_sgd),
)


def round_features(instruction: Instruction, site: Site,
                   run: SiteRunSettings) -> list[SiteFeature]:
    """The features active for ``instruction`` at ``site`` under ``run``, in hook order; one
    that is off is not built, and its file is not entered when its gate stays shut."""
    return [feature for feature in (gate.factory(instruction, site, run) for gate in FEATURES
                                    if gate.opens(instruction, run))
            if feature is not None]
