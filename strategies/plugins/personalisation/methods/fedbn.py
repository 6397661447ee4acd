"""``fedbn``: each site keeps its normalisation layers (Li et al., "FedBN", ICLR 2021).

Their entries of the update are 0, so the global model's normalisation layers
never move and any aggregator is consistent; DP-SGD and any optimiser are fine.
The model must have normalisation layers holding parameters or statistics (the
app checks it on the model,
:func:`clients.training.personalisation.site_personalisation.require_local_layers`).
"""

from __future__ import annotations

from strategies.plugins.personalisation.method import MethodRules
from strategies.wire.personalisation_options import PERSONALISATION

__all__ = ["FedBN"]


@PERSONALISATION.register("fedbn")
class FedBN(MethodRules):
    """Keeps the site's normalisation layers; no adaptation at evaluation."""

    personalises = True
    keeps_local_layers = True
