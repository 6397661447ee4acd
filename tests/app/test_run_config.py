"""Run-config and node-config parsing: typed values and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config.run_config import CARRIED_KEYS, RunConfig, RunConfigError
from app.config.site_config import SiteConfig, SiteConfigError
from app.server_app import build_strategy
from clients.site.policy import SitePolicy
from clients.site.site import Site
from strategies.plugins.aggregators.fednova import FedNovaOptions
from strategies.plugins.schedules.adacomm import AdaCommOptions
from strategies.plugins.selectors.options import SelectionOptions
from strategies.wire.errors import ConfigError
from tests.app.test_run_keys import PYPROJECT_KEYS


def test_pyproject_defaults_are_valid_and_complete():
    config = RunConfig.from_mapping(PYPROJECT_KEYS)
    assert config == RunConfig()  # the defaults, the plug-in sections' too, are pyproject's
    assert set(config.as_params()) == set(PYPROJECT_KEYS) - set(CARRIED_KEYS)


def test_int_widens_to_float_and_values_are_kept():
    config = RunConfig.from_mapping({"lr": 1, "local-steps": 7, "data-root": "/abs/data"})
    assert config.lr == 1.0 and isinstance(config.lr, float)
    assert config.local_steps == 7 and config.data_root == "/abs/data"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"local-step": 3}, "unknown run-config keys"),
        ({"local-steps": 2.5}, "'local-steps' must be int"),
        ({"local-steps": True}, "'local-steps' must be int"),
        ({"local-steps": 0}, "'local-steps' must be > 0"),
        ({"momentum": 1.0}, "'momentum' must be in"),
        ({"slab-slices": 4}, "'slab-slices' must be odd"),
        ({"image-size": 60}, "multiple of 8"),
        ({"task": "brain"}, "'task' must be one of"),
        ({"data-root": "data/synthetic"}, "must be an absolute path"),
        ({"proximal-mu": 0.01}, "needs optimizer"),
        ({"round.quorum": -1}, "'round.quorum' must be >= 0"),
        ({"strategy.tau-min": 2}, "unknown run-config keys \\['strategy.tau-min'\\]"),
    ],
)
def test_bad_values_name_the_key(values, message):
    with pytest.raises(RunConfigError, match=message):
        RunConfig.from_mapping(values)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"adacomm.tau-min": "x"}, "key 'adacomm.tau-min' must be an int >= 1, got 'x'"),
        ({"adacomm.tau-min": 4, "adacomm.tau-max": 2}, "'adacomm.tau-max' must be 0 .no cap."),
        ({"adacomm.tau": 4}, "unknown run config key 'adacomm.tau'"),
        ({"fednova.server-momentum": 0.5}, "'fednova.server-momentum' was retired: .*"
                                           "strategy.server-opt = \"avgm\" and "
                                           "server-opt.momentum"),
        ({"fednova.min-steps-fraction": 0}, "'fednova.min-steps-fraction' must be in"),
        ({"selection.m": 3, "selection.d": 2}, "'selection.d' must be 0 .adaptive. or >="),
        ({"selection.fairness-rounds": -1}, "'selection.fairness-rounds' must be an int >= 0"),
        ({"strategy.aggregator": "fednova"}, "'strategy.aggregator' = 'fednova' needs optimizer"),
        ({"strategy.selector": "cpow-d", "selection.subset": 0}, "'cpow-d' needs selection.subset"),
        ({"strategy.schedule": "adaptive"}, "'strategy.schedule' must be one of"),
    ],
)
def test_plugin_sections_are_validated_by_their_plugin(values, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig.from_mapping(values)


def test_plugin_sections_are_typed_and_tracked():
    config = RunConfig.from_mapping({"adacomm.tau-min": 2, "fednova.min-steps-fraction": 1,
                                     "selection.m": 3})
    assert config.plugin_options["adacomm"] == AdaCommOptions(tau_min=2)
    assert config.plugin_options["fednova"].min_steps_fraction == 1.0
    assert isinstance(config.plugin_options["fednova"].min_steps_fraction, float)
    assert config.plugin_options["selection"] == SelectionOptions(m=3)
    params = config.as_params()
    assert (params["adacomm.tau-min"], params["selection.m"]) == (2, 3)
    assert params["fednova.min-steps-fraction"] == 1.0
    assert "fednova.server-momentum" not in params  # retired (#45): strategy.server-opt
    assert FedNovaOptions().min_steps_fraction == 0.5


def test_build_strategy_hands_each_plugin_its_section_and_the_run_settings():
    config = RunConfig.from_mapping({
        "strategy.aggregator": "fednova", "optimizer": "sgd", "fednova.min-steps-fraction": 0.25,
        "strategy.schedule": "adacomm", "local-steps": 12, "adacomm.tau-min": 3,
        "adacomm.tau-max": 9, "adacomm.loss-smoothing": 0.25,
        "strategy.selector": "cpow-d", "selection.m": 2, "selection.d": 4,
        "selection.subset": 5, "selection.fairness-rounds": 3, "num-server-rounds": 7,
        "min-nodes": 2, "seed": 1, "norm-bound.kappa": 2.0})
    strategy = build_strategy(config)
    # The default defence (norm-bound) stands in front of the aggregator.
    assert strategy.aggregator.defence.bound.kappa == 2.0
    assert strategy.aggregator.aggregator.min_steps_fraction == 0.25
    schedule = strategy.schedule
    assert (schedule.tau0, schedule.tau_min, schedule.tau_max) == (12, 3, 9)
    assert schedule._smoother.beta == 0.25
    selector = strategy.selector
    assert (selector.m, selector.d, selector.subset, selector.fairness_rounds,
            selector.num_rounds) == (2, 4, 5, 3, 7)


def test_dotted_strategy_keys():
    config = RunConfig.from_mapping({"strategy.aggregator": "fednova", "optimizer": "sgd",
                                     "strategy.schedule": "adacomm", "round.deadline": 30,
                                     "round.quorum": 2})
    assert (config.strategy_aggregator, config.strategy_schedule) == ("fednova", "adacomm")
    assert config.round_deadline == 30.0 and config.round_quorum == 2
    assert config.as_params()["strategy.aggregator"] == "fednova"


def test_simulation_maps_partition_to_hospital():
    site = SiteConfig.from_node_config({"partition-id": 1, "num-partitions": 3}, "/data/syn")
    assert site.name == "hospital-01"
    assert site.data_path == Path("/data/syn/hospital-01")


def test_deployment_node_config_wins():
    site = SiteConfig.from_node_config(
        {"data-path": "/srv/pe", "state-dir": "/var/lib/fedmed", "site-name": "st-olav"}, "")
    assert (site.name, site.data_path, site.state_dir) == (
        "st-olav", Path("/srv/pe"), Path("/var/lib/fedmed"))
    assert site.cache_decoded
    off = SiteConfig.from_node_config({"data-path": "/srv/pe", "cache-decoded": "false"}, "")
    assert not off.cache_decoded


def test_the_site_config_builds_the_rounds_site():
    node = SiteConfig.from_node_config({"data-path": "/srv/pe", "site-name": "st-olav",
                                        "cache-decoded": "false", "local-steps-cap": 5,
                                        "privacy-ledger": "site-runtime"}, "")
    assert node.site() == Site("st-olav", Path("/srv/pe"), Path("/srv/pe/.fedmed-state"),
                               SitePolicy.permissive(), cache_decoded=False, local_steps_cap=5,
                               runtime_ledger=True)


@pytest.mark.parametrize(
    ("node_config", "root", "message"),
    [
        ({"data-path": "relative/pe"}, "", "must be absolute"),
        ({"partition-id": 0}, "", "needs run-config 'data-root'"),
        ({}, "/data", "neither 'data-path'"),
        ({"data-path": "/srv/pe", "cache-decoded": "maybe"}, "", "cache-decoded must be"),
    ],
)
def test_bad_node_config(node_config, root, message):
    with pytest.raises(SiteConfigError, match=message):
        SiteConfig.from_node_config(node_config, root)


def test_the_codec_warmup_reaches_the_strategys_uplink_and_is_checked():
    config = RunConfig.from_mapping({"strategy.codec": "topk:0.01:layer",
                                     "strategy.codec-warmup-rounds": 3})
    uplink = build_strategy(config).uplink
    assert (uplink.codec, uplink.codec_warmup_rounds) == ("topk:0.01:layer", 3)
    with pytest.raises(RunConfigError, match="'strategy.codec-warmup-rounds' is not valid .*"
                                             "needs a codec that keeps a fraction"):
        RunConfig.from_mapping({"strategy.codec": "qsgd:16:b256",
                                "strategy.codec-warmup-rounds": 2})
