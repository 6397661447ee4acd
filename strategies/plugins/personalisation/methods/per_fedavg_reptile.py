r"""``per-fedavg-reptile``: Per-FedAvg with Reptile's meta step (Xia & Cui 2022, Algorithm 2).

A round is ``tau-out`` tasks of ``tau-in`` SGD steps, each followed by the meta
step :math:`w_{t+1} = w_t - \alpha (w_t - \tilde w_t)` (Nichol, Achiam, Schulman
2018, Algorithm 1). Its own rules, beyond SGD only
(:mod:`strategies.plugins.personalisation.rules` derives them):

* ``strategy.schedule = "fixed"`` and ``local-steps = tau-out x tau-in``: the
  server checks the steps a site reports against them;
* with ``strategy.aggregator = "fednova"``, ``momentum = 0``: the optimiser
  restarts every task, so the server's a-norm from the step count would be wrong.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from strategies.plugins.personalisation.method import MethodRules, refuse
from strategies.wire.personalisation_options import PERSONALISATION

if TYPE_CHECKING:
    from strategies.plugins.personalisation.rules import PersonalisationRun
    from strategies.wire.personalisation_options import PersonalisationOptions

__all__ = ["PerFedAvgReptile"]

NAME = "per-fedavg-reptile"


@PERSONALISATION.register(NAME)
class PerFedAvgReptile(MethodRules):
    """SGD only, a fixed round of tau-out x tau-in steps; adapts at evaluation."""

    personalises = True
    adapts = True
    sgd_only = True

    @staticmethod
    def requires(options: PersonalisationOptions, run: PersonalisationRun) -> None:
        """The fixed schedule, the step count and FedNova without momentum."""
        if run.schedule != "fixed":
            refuse(NAME, "needs strategy.schedule = \"fixed\": its round is "
                         "personalisation.tau-out x personalisation.tau-in steps, got "
                         f"{run.schedule!r}")
        steps = options.tau_out * options.tau_in
        if run.local_steps != steps:
            refuse(NAME, f"needs local-steps = personalisation.tau-out x personalisation.tau-in "
                         f"= {steps} (the server checks the steps a site reports against "
                         f"it), got local-steps = {run.local_steps}")
        if run.aggregator == "fednova" and run.momentum:
            refuse(NAME, "with strategy.aggregator = \"fednova\" needs momentum = 0: the "
                         "optimiser restarts every task, so the server's a-norm would be wrong")
