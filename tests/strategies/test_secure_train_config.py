"""``strategy.secure-aggregation = "secagg+"``: the run config's combinations it refuses, by key.

Secure aggregation hides each site's update from the coordinator, so every plug-in that
needs one (a defence, a robust rule, a per-site codec, the adaptive compression rate) is
refused before the federation starts, the error naming the key; the ``secagg.*`` section
is validated like every plug-in section.
"""

from __future__ import annotations

import pytest

from app.config.run_config import RunConfig
from app.server_app import build_strategy
from strategies.wire.errors import ConfigError
from strategies.wire.secure_aggregation.settings import SecAggSettings

SECURE = {"strategy.secure-aggregation": "secagg+", "strategy.defence": "none"}


@pytest.mark.parametrize(("values", "key"), [
    ({"strategy.defence": "norm-bound"}, "'strategy.defence' = 'norm-bound'"),
    ({"strategy.defence": "multi-krum"}, "'strategy.defence' = 'multi-krum'"),
    ({"strategy.aggregator": "median"}, "'strategy.aggregator' = 'median'"),
    ({"strategy.aggregator": "trimmed-mean"}, "'strategy.aggregator' = 'trimmed-mean'"),
    ({"strategy.codec": "topk:0.1"}, "'strategy.codec' = 'topk:0.1'"),
    ({"strategy.codec": "topk:0.1:layer"}, "'strategy.codec' = 'topk:0.1:layer'"),
    ({"strategy.codec": "qsgd:4"}, "'strategy.codec' = 'qsgd:4'"),
    ({"strategy.codec": "sign"}, "'strategy.codec' = 'sign'"),
    ({"strategy.codec": "randk:0.1", "strategy.codec-rate": "adaptive"},
     "'strategy.codec-rate' = 'adaptive'"),
    ({"secagg.bits": 31}, "'secagg.bits'"),
    ({"secagg.clip": 0.0}, "secagg.clip"),
    ({"secagg.threshold": 1.5}, "secagg.threshold"),
    ({"secagg.neighbours": 1}, "secagg.neighbours"),
    ({"secagg.min-participants": 1}, "'secagg.min-participants'"),
])
def test_a_combination_secagg_cannot_serve_is_refused_naming_the_key(values, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.").replace("+", r"\+")):
        RunConfig.from_mapping({**SECURE, **values})


@pytest.mark.parametrize("values", [
    {}, {"strategy.codec": "fp16"}, {"strategy.codec": "randk:0.1"},
    {"strategy.aggregator": "fednova", "optimizer": "sgd", "strategy.server-opt": "avgm"},
    {"secagg.bits": 16, "secagg.neighbours": 4, "secagg.threshold": 0.75,
     "secagg.min-participants": 3, "secagg.clip": 0.5},
])
def test_the_linear_combinations_build_a_secure_strategy(values):
    config = RunConfig.from_mapping({**SECURE, **values})
    strategy = build_strategy(config)
    assert strategy.secure is not None
    expected = {key.split(".", 1)[1].replace("-", "_"): value for key, value in values.items()
                if key.startswith("secagg.")}
    assert strategy.secure.settings == SecAggSettings(**expected)


def test_the_default_run_config_keeps_the_plain_round():
    assert build_strategy(RunConfig()).secure is None
