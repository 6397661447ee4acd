"""``none``: FedAvg-style training with the global model only; no site keeps a model of its own."""

from __future__ import annotations

from strategies.plugins.personalisation.method import MethodRules
from strategies.wire.personalisation_options import PERSONALISATION

__all__ = ["NoPersonalisation"]


@PERSONALISATION.register("none")
class NoPersonalisation(MethodRules):
    """No personalisation: every flag off."""
