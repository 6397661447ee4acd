"""The run config's ``privacy.*`` keys (app/config/run_config.py)."""

from __future__ import annotations

import pytest

from app.config.run_config import RunConfig, RunConfigError


def test_defaults_are_no_dp_and_delta_is_a_param():
    config = RunConfig.from_mapping({})
    assert (config.dp_noise_multiplier, config.dp_max_grad_norm, config.dp_delta) == (0.0, 1.0, 1e-5)
    params = config.as_params()
    assert params["privacy.delta"] == 1e-5 and params["privacy.noise-multiplier"] == 0.0


def test_values_are_read():
    config = RunConfig.from_mapping({"privacy.noise-multiplier": 1.1, "privacy.max-grad-norm": 2,
                                     "privacy.delta": 1e-6, "privacy.accountant": "prv"})
    assert (config.dp_noise_multiplier, config.dp_max_grad_norm, config.dp_delta) == (1.1, 2.0, 1e-6)
    assert config.dp_accountant == "prv" and config.as_params()["privacy.accountant"] == "prv"
    assert RunConfig.from_mapping({}).dp_accountant == "rdp"


@pytest.mark.parametrize("key, value, rule", [
    ("privacy.noise-multiplier", -0.5, "must be >= 0"),
    ("privacy.max-grad-norm", 0.0, "must be > 0"),
    ("privacy.delta", 0.0, r"must be in \(0, 1\)"),
    ("privacy.delta", 1.0, r"must be in \(0, 1\)"),
    ("privacy.delta", "small", "must be float"),
    ("privacy.accountant", "gdp", r"must be one of \['prv', 'rdp'\]"),
])
def test_bad_values_name_the_key(key, value, rule):
    with pytest.raises(RunConfigError, match=f"'{key}' {rule}"):
        RunConfig.from_mapping({key: value})


def test_proximal_term_is_refused_with_dp():
    """Opacus clips the per-example gradients only: a FedProx term would bypass DP-SGD."""
    with pytest.raises(RunConfigError, match="'proximal-mu' with DP-SGD"):
        RunConfig.from_mapping({"privacy.noise-multiplier": 1.0, "proximal-mu": 0.1,
                                "optimizer": "sgd", "momentum": 0.0})
