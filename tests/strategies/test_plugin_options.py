"""Plug-ins own their options: typed sections, errors naming the key, registry build."""

from __future__ import annotations

import re
from dataclasses import FrozenInstanceError, dataclass

import pytest

from strategies.plugins.run_settings import RunSettings
from strategies.wire.plugin_options import NoOptions, Plugin, PluginError, PluginOptions, option
from strategies.plugins.registries import (
    AGGREGATORS,
    PLUGIN_REGISTRIES,
    SCHEDULES,
    SECURE_AGGREGATION,
    SELECTORS,
    build,
    check,
    default_sections,
    parse_sections,
)
from strategies.wire.registry import Registry


def _settings(**changes: object) -> RunSettings:
    values = {"local_steps": 5, "num_rounds": 3, "fraction_train": 1.0, "min_nodes": 1,
              "seed": 0, "optimizer": "sgd", "codec": "topk:0.01"}
    return RunSettings(**{**values, **changes})


@dataclass(frozen=True)
class ToyOptions(PluginOptions):
    section = "toy"
    scale: float = option(0.5, at_least=0.0, below=1.0)
    rounds: int = option(2, at_least=1)
    label: str = option("a")
    on: bool = option(True)


def test_options_are_typed_frozen_and_widen_ints():
    toy = ToyOptions.from_section({"scale": 0, "rounds": 3})
    assert toy == ToyOptions(scale=0.0, rounds=3) and isinstance(toy.scale, float)
    with pytest.raises(FrozenInstanceError):
        toy.rounds = 4  # type: ignore[misc]
    assert toy.as_params() == {"toy.scale": 0.0, "toy.rounds": 3, "toy.label": "a",
                               "toy.on": True}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"scale": 1.0}, "run config key 'toy.scale' must be a float in \\[0, 1\\), got 1.0"),
        ({"scale": "x"}, "'toy.scale' must be a float in \\[0, 1\\), got 'x'"),
        ({"rounds": 0}, "run config key 'toy.rounds' must be an int >= 1, got 0"),
        ({"rounds": 2.0}, "'toy.rounds' must be an int >= 1, got 2.0"),
        ({"rounds": True}, "'toy.rounds' must be an int"),
        ({"label": 3}, "'toy.label' must be a string, got 3"),
        ({"on": "yes"}, "'toy.on' must be a bool, got 'yes'"),
        ({"sacle": 0.1}, "unknown run config key 'toy.sacle'; section 'toy' has"),
    ],
)
def test_bad_options_name_the_full_key(values, message):
    with pytest.raises(PluginError, match=message):
        ToyOptions.from_section(values)


def test_every_plugin_declares_options_and_builds_from_them():
    settings = _settings()
    sections = default_sections()
    for registry in PLUGIN_REGISTRIES:
        if registry is SECURE_AGGREGATION:  # it refuses top-k (per-site indices)
            settings = _settings(codec="randk:0.01")
        for name in registry.names():
            plugin = registry.get(name)
            assert issubclass(plugin.Options, PluginOptions), name
            assert plugin.Options is NoOptions or plugin.Options.section in sections
            if name == "cpow-d":
                assert build(registry, name, sections, settings).subset == 32
            assert isinstance(build(registry, name, sections, settings), plugin)


def test_sections_keep_the_rest_of_the_run_config_apart():
    sections, rest = parse_sections({"adacomm.tau-max": 8, "local-steps": 3,
                                     "strategy.schedule": "adacomm"})
    assert sections["adacomm"].tau_max == 8
    assert sections["fednova"] == sections["fednova"].__class__()
    assert sorted(rest) == ["local-steps", "strategy.schedule"]


def test_unknown_plugin_names_the_choice_key_and_the_known_names():
    # the registry's names, not a copy of them: a new aggregator is its file and its test
    names = re.escape(str(AGGREGATORS.names()))
    assert AGGREGATORS.names()[:2] == ["fedavg", "fednova"]
    with pytest.raises(PluginError, match=f"'strategy.aggregator' must be one of {names}"):
        build(AGGREGATORS, "krum", default_sections(), _settings())


def test_plugins_no_longer_swallow_unknown_keywords():
    with pytest.raises(PluginError, match="fixed"):
        SCHEDULES.create("fixed", tau0=2, tau_min=1)
    with pytest.raises(PluginError, match="uniform"):
        SELECTORS.create("uniform", m=1, d=3)


def test_a_plugin_can_check_the_rest_of_the_run_config():
    sections = default_sections()
    with pytest.raises(PluginError, match="needs optimizer = \"sgd\".*got optimizer = 'adam'"):
        check(AGGREGATORS, "fednova", sections, _settings(optimizer="adam"))
    check(AGGREGATORS, "fednova", sections, _settings(optimizer="sgd"))
    check(AGGREGATORS, "fedavg", sections, _settings(optimizer="adam"))


def test_a_registry_takes_a_new_plugin_with_its_section():
    toys: Registry[type] = Registry("toy", "strategy.toy", package="strategies.plugins.aggregators",
                                   error=PluginError)

    @toys.register("scaled")
    class Scaled(Plugin):
        Options = ToyOptions

        def __init__(self, scale: float) -> None:
            self.scale = scale

        @classmethod
        def from_options(cls, options: ToyOptions, settings: RunSettings) -> Scaled:
            return cls(options.scale * settings.local_steps)

    built = build(toys, "scaled", {"toy": ToyOptions(scale=0.25)}, _settings(local_steps=4))
    assert built.scale == 1.0
    assert build(toys, "scaled", {}, _settings(local_steps=4)).scale == 2.0
    with pytest.raises(PluginError, match="toy 'scaled' registered twice"):
        toys.register("scaled")(Scaled)
