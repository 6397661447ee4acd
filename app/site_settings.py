"""The run config as a site reads it: :class:`~clients.site.run_settings.SiteRunSettings`.

One conversion for the ClientApp adapter (:mod:`app.client_app`) and ``make
predict PERSONAL=...`` (:mod:`app.prediction.personalised`), so both hand the
site the same values.
"""

from __future__ import annotations

from app.config.run_config import RunConfig
from clients.site.run_settings import SiteRunSettings
from clients.training.private_training import DpSettings

__all__ = ["site_settings"]


def site_settings(config: RunConfig) -> SiteRunSettings:
    """What a site's round reads of ``config``."""
    return SiteRunSettings(
        task=config.task, sizes=config.task_settings(), local_steps=config.local_steps,
        optimizer=config.optimizer, lr=config.lr, momentum=config.momentum, seed=config.seed,
        num_server_rounds=config.num_server_rounds, time_budget=config.time_budget,
        proximal_mu=config.proximal_mu,
        privacy=DpSettings(config.dp_noise_multiplier, config.dp_max_grad_norm, config.dp_delta,
                           config.dp_accountant),
        personalisation=config.personalisation_options)
