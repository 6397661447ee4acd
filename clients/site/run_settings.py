"""What a site reads of the run config: the task, its sizes, the optimiser, DP, personalisation.

The ClientApp adapter builds it from the run config (:func:`app.site_settings.site_settings`);
the site's round (:mod:`clients.site.site_round`) and ``make predict PERSONAL=...`` read it.
Plain values: no Flower, no run-config parsing (that is the app's).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clients.training.private_training import DpSettings
from clients.training.site_task import TaskSettings
from strategies.plugins.personalisation.options import PersonalisationOptions

__all__ = ["SiteRunSettings"]


@dataclass(frozen=True)
class SiteRunSettings:
    """The run's settings a site's round uses (run-config keys in the comments)."""

    #: ``task``: the registered task name.
    task: str
    #: ``image-size``, ``batch-size``, ... of the task.
    sizes: TaskSettings
    #: ``local-steps``: tau when an instruction names none.
    local_steps: int
    #: ``optimizer``, ``lr``, ``momentum``: the local solver.
    optimizer: str
    lr: float
    momentum: float
    #: ``seed``: the run seed (:func:`strategies.seeds.site_seed`).
    seed: int
    #: ``num-server-rounds``: a train message after the last round is the final fine-tuning.
    num_server_rounds: int
    #: ``time-budget``: seconds of local training when an instruction names none (0 = none).
    time_budget: float = 0.0
    #: ``proximal-mu``: FedProx's proximal term (0 = none).
    proximal_mu: float = 0.0
    #: ``privacy.*``: DP-SGD (noise multiplier 0 = none).
    privacy: DpSettings = field(default_factory=DpSettings)
    #: ``personalisation.*``: the method and its sizes.
    personalisation: PersonalisationOptions = field(default_factory=PersonalisationOptions)
