"""Issue 16: ``personalisation.*`` in the run config, checked when the config is read."""

from __future__ import annotations

import pytest
from torch import nn

from app.config.run_config import RunConfig
from clients.training.personalisation.site_personalisation import require_local_layers
from strategies.wire.errors import ConfigError

REPTILE = {"personalisation.method": "per-fedavg-reptile", "optimizer": "sgd",
           "local-steps": 6, "personalisation.tau-out": 3, "personalisation.tau-in": 2}


def test_the_default_is_no_personalisation():
    config = RunConfig.from_mapping({})
    assert config.personalisation == "none"
    assert config.as_params()["personalisation.method"] == "none"


def test_a_reptile_run_is_read_with_its_section():
    config = RunConfig.from_mapping({**REPTILE, "personalisation.alpha": 0.25})
    assert config.personalisation == "per-fedavg-reptile"
    options = config.personalisation_options
    assert (options.tau_out, options.alpha) == (3, 0.25)
    assert config.as_params()["personalisation.tau-in"] == 2


@pytest.mark.parametrize(("change", "message"), [
    ({"optimizer": "adam"}, "'personalisation.method' = 'per-fedavg-reptile' needs optimizer"),
    ({"local-steps": 200}, "needs local-steps = personalisation.tau-out x"),
    ({"personalisation.tau-out": "3"}, "'personalisation.tau-out' must be an int >= 1"),
    ({"personalisation.method": "fedprox"}, "'personalisation.method' must be one of"),
    ({"personalisation.method": "finetune", "privacy.noise-multiplier": 1.0},
     "'personalisation.method' = 'finetune' adapts on the training data"),
])
def test_bad_personalisation_is_refused_naming_the_key(change, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig.from_mapping({**REPTILE, **change})


def test_fedbn_needs_normalisation_layers_with_state():
    require_local_layers("fedbn", nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)), "cxr-cls")
    require_local_layers("none", nn.Linear(2, 2), "pe-seg")
    stateless = nn.Sequential(nn.Conv2d(1, 2, 3), nn.InstanceNorm2d(2))  # as MONAI's default
    with pytest.raises(ConfigError, match="'personalisation.method' = 'fedbn' needs a model with "
                                          "normalisation layers .* task 'pe-seg'"):
        require_local_layers("fedbn", stateless, "pe-seg")
