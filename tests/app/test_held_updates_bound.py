"""Run config ``round.max-held-mb`` bounds the updates a robust rule holds; FedAvg streams past it."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord

from app.config.run_config import RunConfig, RunConfigError
from app.engine import InProcessGrid, VirtualSite
from app.server_app import build_strategy
from strategies.wire.errors import ConfigError


def _configure(values: dict) -> list:
    strategy = build_strategy(RunConfig.from_mapping({"min-nodes": 10, **values}))
    model = ArrayRecord([np.zeros(2**18, np.float32)])  # 1 MiB
    ten_sites = InProcessGrid([VirtualSite({}, node_id=node) for node in range(2, 12)])
    return list(strategy.configure_train(1, model, ConfigRecord(), ten_sites))


def test_a_robust_rule_beyond_the_bound_is_refused_naming_the_key(server_identity):
    with pytest.raises(ConfigError, match=r"'round\.max-held-mb' = 5: MedianAggregator needs "
                                          r"all 10 selected"):
        _configure({"strategy.aggregator": "median", "strategy.defence": "none",
                    "round.max-held-mb": 5.0})
    assert len(_configure({"strategy.aggregator": "median", "strategy.defence": "none",
                           "round.max-held-mb": 10.0})) == 10


def test_fedavg_without_defence_streams_whatever_the_bound(server_identity):
    # round 1 without a roster holds the updates until the sizes are known, unless the
    # relative size cap is off (tests/strategies/test_size_ratio.py)
    assert len(_configure({"strategy.defence": "none", "round.max-held-mb": 1.0,
                           "federation.max-size-ratio": 0.0})) == 10


def test_a_first_round_held_for_the_sizes_is_refused_naming_the_keys(server_identity):
    with pytest.raises(ConfigError, match=r"'round\.max-held-mb' = 5: the round holds all 10 "
                                          r".*'federation\.max-size-ratio' = 0"):
        _configure({"strategy.defence": "none", "round.max-held-mb": 5.0})


def test_the_size_ratio_reaches_the_site_book():
    strategy = build_strategy(RunConfig.from_mapping({"federation.max-size-ratio": 4.0}))
    assert strategy.sites.max_size_ratio == 4.0
    assert build_strategy(RunConfig.from_mapping({})).sites.max_size_ratio == 3.0
    with pytest.raises(RunConfigError, match="'federation.max-size-ratio' must be 0 .off. "
                                             "or >= 1"):
        RunConfig.from_mapping({"federation.max-size-ratio": 0.5})


def test_the_bound_must_be_positive():
    with pytest.raises(RunConfigError, match="'round.max-held-mb' must be > 0"):
        RunConfig.from_mapping({"round.max-held-mb": 0.0})
