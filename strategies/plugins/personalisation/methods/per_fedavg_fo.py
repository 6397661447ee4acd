"""``per-fedavg-fo``: Per-FedAvg, first-order (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020).

Each local step is one step of the site's SGD with the gradient taken at
``w - inner_lr grad f(w)``; the coefficients are those of plain local SGD, so
FedNova's a-norm from the step count is exact, momentum included. Its inner
optimiser is SGD (:mod:`strategies.plugins.personalisation.rules`).
"""

from __future__ import annotations

from strategies.plugins.personalisation.method import MethodRules
from strategies.wire.personalisation_options import PERSONALISATION

__all__ = ["PerFedAvgFO"]


@PERSONALISATION.register("per-fedavg-fo")
class PerFedAvgFO(MethodRules):
    """SGD only; adapts at evaluation with gradient steps of ``inner-lr``."""

    personalises = True
    adapts = True
    sgd_only = True
