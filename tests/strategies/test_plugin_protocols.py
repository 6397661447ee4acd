"""Every registered plug-in meets the Protocol of its kind: attributes and method signatures."""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Generic, Protocol

import pytest

from strategies.rounds.update_stream import DefendedAggregator
from strategies.wire.codecs.registry import CODECS, UpdateCodec
from strategies.plugins.protocols import (
    Aggregator,
    CodecRate,
    ControlVariates,
    Defence,
    PluginClass,
    Pruning,
    Schedule,
    SecureAggregation,
    SecureSumAggregator,
    Selector,
    ServerOptimizer,
    StreamingAggregator,
)
from strategies.plugins import registries
from strategies.plugins.registries import AGGREGATORS, DEFENCES, build, default_sections
from strategies.plugins.run_settings import RunSettings
from strategies.wire.registry import Registry

SETTINGS = RunSettings(local_steps=5, num_rounds=3, fraction_train=1.0, min_nodes=1, seed=0,
                       optimizer="sgd", codec="topk:0.01")
KINDS: list[tuple[Registry[type], type]] = [
    (AGGREGATORS, Aggregator), (DEFENCES, Defence), (registries.SCHEDULES, Schedule),
    (registries.CODEC_RATES, CodecRate), (registries.SELECTORS, Selector),
    (registries.SECURE_AGGREGATION, SecureAggregation), (registries.PRUNINGS, Pruning),
    (registries.CONTROL_VARIATES, ControlVariates),
    (registries.SERVER_OPTIMIZERS, ServerOptimizer),
]
#: Secure aggregation refuses top-k (per-site indices): its plug-ins are built with rand-k.
SETTINGS_OF = {registries.SECURE_AGGREGATION.key: replace(SETTINGS, codec="randk:0.01")}


def _parameters(function: object) -> list[str]:
    return [p.name for p in inspect.signature(function).parameters.values()  # type: ignore[arg-type]
            if p.name not in ("self", "cls")]


def assert_meets(value: object, protocol: type) -> None:
    """``value`` passes ``isinstance`` and each method takes the Protocol's parameters."""
    assert isinstance(value, protocol), f"{value!r} is no {protocol.__name__}"
    members = {name: getattr(member, "__func__", member)
               for klass in reversed(protocol.__mro__) if klass not in (object, Protocol, Generic)
               for name, member in vars(klass).items()}
    for name, member in members.items():
        if inspect.isfunction(member) and not name.startswith("_"):
            assert _parameters(getattr(value, name)) == _parameters(member), (
                f"{type(value).__name__}.{name} does not take {protocol.__name__}.{name}'s "
                f"parameters")


def test_every_plugin_registry_has_a_protocol():
    assert sorted(r.key for r, _ in KINDS) == sorted(r.key for r in registries.PLUGIN_REGISTRIES)


@pytest.mark.parametrize(("registry", "protocol"), KINDS, ids=lambda k: getattr(k, "kind", ""))
def test_every_registered_plugin_meets_its_protocol(registry, protocol):
    sections = default_sections()
    assert registry.names()
    for name, plugin in registry.entries().items():
        assert_meets(plugin, PluginClass)
        assert_meets(build(registry, name, sections, SETTINGS_OF.get(registry.key, SETTINGS)),
                     protocol)


def test_linear_aggregators_stream_and_the_others_say_they_do_not():
    streaming = [name for name, plugin in AGGREGATORS.entries().items()
                 if not build(AGGREGATORS, name, default_sections(), SETTINGS).needs_all_updates]
    assert streaming == ["fedavg", "fednova"]
    for name in streaming:  # and finish from a secure sum (SecAgg+)
        assert_meets(AGGREGATORS.create(name), SecureSumAggregator)


@pytest.mark.parametrize(("defence", "streams"),
                         [("none", True), ("norm-bound", False), ("multi-krum", False)])
def test_a_defended_aggregator_streams_only_when_its_defence_does(defence, streams):
    defended = DefendedAggregator(DEFENCES.create(defence), AGGREGATORS.create("fedavg"))
    assert_meets(defended, StreamingAggregator)
    assert defended.needs_all_updates is not streams
    assert DefendedAggregator(DEFENCES.create("norm-bound", kappa=0.0, absolute=1.0),
                              AGGREGATORS.create("fedavg")).needs_all_updates is False


def test_every_registered_codec_meets_the_codec_protocol():
    assert CODECS.names()
    for codec in CODECS.entries().values():
        assert_meets(codec, UpdateCodec)
