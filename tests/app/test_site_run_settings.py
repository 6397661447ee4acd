"""The site's own parse of the run config: the server's values, its keys, errors naming the key.

The defaults are the run-config table's, as the server's (tests/app/test_run_keys.py).
"""

from __future__ import annotations

import pytest

from app.config.run_config import RunConfig
from app.engine import full_run_config
from clients.site.instruction import SiteRunSettings
from strategies.wire.errors import ConfigError


def _as_site_reads(config: RunConfig) -> SiteRunSettings:
    """What the site should read of a validated run config, field by field."""
    from clients.training.private_training import DpSettings
    return SiteRunSettings(
        task=config.task, sizes=config.task_settings(), local_steps=config.local_steps,
        optimizer=config.optimizer, lr=config.lr, momentum=config.momentum, seed=config.seed,
        num_server_rounds=config.num_server_rounds, time_budget=config.time_budget,
        proximal_mu=config.proximal_mu, data_root=config.data_root,
        site_policy=config.site_policy,
        privacy=DpSettings(config.dp_noise_multiplier, config.dp_max_grad_norm,
                           config.dp_delta, config.dp_accountant),
        personalisation=config.personalisation_options)


def test_reads_the_same_values_as_the_run_config() -> None:
    values = full_run_config({"local-steps": 7, "lr": 1, "optimizer": "sgd", "momentum": 0.0,
                              "image-size": 32, "privacy.noise-multiplier": 1.1,
                              "personalisation.method": "fedbn", "data-root": "/d"})
    assert SiteRunSettings.from_run_config(values) == _as_site_reads(
        RunConfig.from_mapping(values))


@pytest.mark.parametrize(("key", "value"), [
    ("local-steps", 0), ("local-steps", "9"), ("lr", -1.0), ("momentum", 1.0),
    ("optimizer", "adagrad"), ("batch-size", 0), ("privacy.delta", 1.0),
    ("privacy.accountant", "gdp"), ("time-budget", -1.0), ("slab-slices", 4),
    ("lr-floor", 2.0), ("model-size", "huge"),
])
def test_a_bad_site_key_fails_naming_it(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"'{key}'"):
        SiteRunSettings.from_run_config({key: value})


def test_the_servers_keys_are_not_the_sites() -> None:
    settings = SiteRunSettings.from_run_config({"strategy.aggregator": "anything",
                                                "norm-bound.kappa": "x"})
    assert settings == SiteRunSettings.from_run_config({})
