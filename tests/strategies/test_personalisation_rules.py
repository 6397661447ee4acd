"""Issue 16: the ``personalisation`` section, the combinations refused, and the FedNova claim."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from strategies.aggregation import fednova_delta
from strategies.wire.personalisation_gain import personalisation_gains
from strategies.wire.plugin_options import PluginError
from strategies.wire.personalisation_options import PersonalisationOptions, split_personalisation
from strategies.plugins.personalisation.rules import PersonalisationRun, check_personalisation

REPTILE_RUN = PersonalisationRun(local_steps=16, optimizer="sgd", momentum=0.0, proximal_mu=0.0,
                                 aggregator="fedavg", schedule="fixed", dp_noise_multiplier=0.0)


def _options(**values) -> PersonalisationOptions:
    return PersonalisationOptions(**values)


def test_the_section_is_split_from_the_run_config_and_defaults_to_none():
    options, rest = split_personalisation({"personalisation.tau-out": 2, "local-steps": 3})
    assert options == PersonalisationOptions(tau_out=2) and options.method == "none"
    assert rest == {"local-steps": 3}
    assert PersonalisationOptions().as_params() == {
        "personalisation.method": "none", "personalisation.tau-out": 4,
        "personalisation.tau-in": 4, "personalisation.alpha": 0.5,
        "personalisation.inner-lr": 0.01, "personalisation.finetune-steps": 1}


@pytest.mark.parametrize(("values", "message"), [
    ({"method": "per-fedavg"},
     "'personalisation.method' must be one of \\[.*'none'.*got 'per-fedavg'"),
    ({"alpha": 0.0}, "'personalisation.alpha' must be in \\(0, 1\\], got 0.0"),
    ({"alpha": 1.5}, "'personalisation.alpha' must be in \\(0, 1\\], got 1.5"),
    ({"tau-in": 0}, "'personalisation.tau-in' must be an int >= 1, got 0"),
    ({"inner-lr": 0.0}, "'personalisation.inner-lr' must be > 0, got 0.0"),
    ({"finetune-steps": 0}, "'personalisation.finetune-steps' must be an int >= 1"),
    ({"tau_out": 2}, "unknown run config key 'personalisation.tau_out'"),
])
def test_bad_values_name_the_key(values, message):
    with pytest.raises(PluginError, match=message):
        PersonalisationOptions.from_section(values)


@pytest.mark.parametrize(("method", "change", "message"), [
    ("per-fedavg-reptile", {"optimizer": "adam"}, "needs optimizer = \"sgd\""),
    ("per-fedavg-reptile", {"local_steps": 200}, "needs local-steps = personalisation.tau-out x "
                                                 "personalisation.tau-in = 16"),
    ("per-fedavg-reptile", {"schedule": "adacomm"}, "needs strategy.schedule = \"fixed\""),
    ("per-fedavg-reptile", {"proximal_mu": 0.1}, "with proximal-mu > 0"),
    ("per-fedavg-reptile", {"aggregator": "fednova", "momentum": 0.9},
     "strategy.aggregator = \"fednova\" needs momentum = 0"),
    ("per-fedavg-reptile", {"dp_noise_multiplier": 1.0}, "privacy.noise-multiplier > 0"),
    ("finetune", {"dp_noise_multiplier": 1.0}, "privacy.noise-multiplier > 0"),
    ("per-fedavg-fo", {"optimizer": "adam"}, "needs optimizer = \"sgd\""),
    ("per-fedavg-fo", {"proximal_mu": 0.1}, "with proximal-mu > 0"),
    ("per-fedavg-fo", {"dp_noise_multiplier": 1.0}, "privacy.noise-multiplier > 0"),
])
def test_combinations_that_make_no_sense_are_refused(method, change, message):
    run = dataclasses.replace(REPTILE_RUN, **change)
    with pytest.raises(PluginError, match=f"'personalisation.method' = '{method}' .*{message}"):
        check_personalisation(_options(method=method), run)


@pytest.mark.parametrize(("method", "change"), [
    ("per-fedavg-reptile", {}),
    ("per-fedavg-reptile", {"aggregator": "fednova"}),  # momentum 0: the a-norm is consistent
    ("per-fedavg-reptile", {"momentum": 0.9}),          # FedAvg does not use the a-norm
    ("fedbn", {"dp_noise_multiplier": 1.0, "optimizer": "adam"}),
    ("finetune", {"optimizer": "adam", "local_steps": 200, "schedule": "adacomm"}),
    ("none", {"optimizer": "adam", "local_steps": 200}),
    ("per-fedavg-fo", {"aggregator": "fednova", "momentum": 0.9, "local_steps": 200,
                       "schedule": "adacomm"}),
])
def test_sensible_combinations_pass(method, change):
    check_personalisation(_options(method=method), dataclasses.replace(REPTILE_RUN, **change))


def test_one_reptile_alpha_cancels_in_fednova():
    """rules.py: Delta_i = alpha eta sum g, ||a_i|| = alpha s_i; the server's s_i gives the same."""
    rng = np.random.default_rng(0)
    alpha, steps, sizes = 0.3, [16, 7, 12], [10, 30, 20]
    sgd_sums = [[rng.normal(size=5)] for _ in steps]  # eta * sum of the gradients of each site
    deltas = [[alpha * s[0]] for s in sgd_sums]
    exact = fednova_delta(deltas, sizes, [alpha * s for s in steps])
    server = fednova_delta(deltas, sizes, [float(s) for s in steps])
    np.testing.assert_allclose(server[0], exact[0], rtol=1e-12)


def test_gains_are_personalised_minus_global_for_the_metrics_with_both():
    values = {"val-auc": 0.5, "personalised-val-auc": 0.75, "val-loss": 0.75,
              "personalised-val-loss": 0.5, "personalised-val-f1": 0.25, "num-examples": 8}
    assert personalisation_gains(values) == {"personalised-gain-val-auc": 0.25,
                                             "personalised-gain-val-loss": -0.25}
    assert personalisation_gains({"val-auc": 0.5, "num-examples": 8}) == {}
