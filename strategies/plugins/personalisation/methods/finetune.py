"""``finetune``: "FedAvg with one update" (Xia & Cui 2022): trains as FedAvg, adapts at evaluation.

The site's personalised model is the global model after
``personalisation.finetune-steps`` local steps of the run's optimiser on its
training data.
"""

from __future__ import annotations

from strategies.plugins.personalisation.method import MethodRules
from strategies.wire.personalisation_options import PERSONALISATION

__all__ = ["FineTune"]


@PERSONALISATION.register("finetune")
class FineTune(MethodRules):
    """Adapts on the training data at evaluation; any optimiser."""

    personalises = True
    adapts = True
