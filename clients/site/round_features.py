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

SecAgg+'s :class:`~clients.site.secure_update.SecureMasking` is not among them: the
collect stage builds it with the site's participant (:mod:`clients.site.secure_round`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clients.site.last_global import DownlinkInstruction, DownlinkReceive
from clients.site.privacy_charge import PrivateTraining
from clients.site.secure_update import SecureInstruction
from clients.site.site_feature import FeatureFactory, InstructionPart, SiteFeature
from clients.site.site_pruning import PruningInstruction, SitePruning
from clients.site.site_scaffold import ControlInstruction, SiteScaffold
from clients.training.personalisation.site_personalisation import PersonalisedTraining

if TYPE_CHECKING:
    from clients.site.instruction import Instruction
    from clients.site.run_settings import SiteRunSettings
    from clients.site.site import Site

__all__ = ["FEATURES", "INSTRUCTION_PARTS", "round_features"]

#: The features' parts of an instruction, in the order they are read.
INSTRUCTION_PARTS: tuple[type[InstructionPart], ...] = (
    DownlinkInstruction, ControlInstruction, SecureInstruction, PruningInstruction)

#: The features of a site's round, in hook order.
FEATURES: tuple[FeatureFactory, ...] = (
    SiteScaffold.of, PersonalisedTraining.of, SitePruning.of, DownlinkReceive.of,
    PrivateTraining.of)


def round_features(instruction: Instruction, site: Site,
                   run: SiteRunSettings) -> list[SiteFeature]:
    """The features active for ``instruction`` at ``site`` under ``run``, in hook order; one
    that is off is not built."""
    return [feature for feature in (factory(instruction, site, run) for factory in FEATURES)
            if feature is not None]
