"""The strategy plug-in registries and their run-config sections.

Each kind of plug-in is a :class:`~strategies.wire.registry.Registry` that owns one
folder of ``strategies/plugins/`` and one run-config choice key:

* ``AGGREGATORS``: ``aggregators/``, chosen by ``strategy.aggregator``
  (:class:`~strategies.plugins.protocols.Aggregator`);
* ``SCHEDULES``: ``schedules/``, chosen by ``strategy.schedule``
  (:class:`~strategies.plugins.protocols.Schedule`);
* ``CODEC_RATES``: the compression-rate schedules in the same folder, chosen by
  ``strategy.codec-rate`` (:class:`~strategies.plugins.protocols.CodecRate`);
* ``SELECTORS``: ``selectors/``, chosen by ``strategy.selector``
  (:class:`~strategies.plugins.protocols.Selector`);
* ``DEFENCES``: ``defences/``, chosen by ``strategy.defence``
  (:class:`~strategies.plugins.protocols.Defence`);
* ``SECURE_AGGREGATION``: ``secure_aggregation/``, chosen by
  ``strategy.secure-aggregation`` (:class:`~strategies.plugins.protocols.SecureAggregation`);
* ``PRUNINGS``: ``pruning/``, chosen by ``strategy.pruning``
  (:class:`~strategies.plugins.protocols.Pruning`);
* ``CONTROL_VARIATES``: ``control_variates/``, chosen by ``strategy.control-variates``
  (:class:`~strategies.plugins.protocols.ControlVariates`);
* ``SERVER_OPTIMIZERS``: ``server_opt/``, chosen by ``strategy.server-opt``
  (:class:`~strategies.plugins.protocols.ServerOptimizer`).

A plug-in module registers its class with ``@REGISTRY.register("name")``; every
module of the folder is imported on first use, so dropping a file there is all
it takes. A plug-in class (usually a :class:`~strategies.wire.plugin_options.Plugin`)
provides (see ``plugins/aggregators/fednova.py``):

* ``Options``: its typed options, a :class:`~strategies.wire.plugin_options.PluginOptions`
  dataclass naming its run-config section (:class:`NoOptions` when it has none);
* ``from_options(options, settings)``: the instance for a run (``Plugin``'s default
  passes each option as the ``__init__`` keyword of the same name);
* ``requires(options, settings)``: a check against the rest of the run config
  (FedNova's needs ``optimizer = "sgd"``), raising :class:`PluginError`; ``Plugin``'s
  default accepts any.

These are :class:`~strategies.plugins.protocols.PluginClass`; the built instance
meets its kind's Protocol (:mod:`strategies.plugins.protocols`).

:func:`parse_sections` validates every plug-in section of a run config, so the
run config itself names no plug-in; :func:`check` and :func:`build` turn a
registered name into a checked plug-in for a run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from strategies.plugins.run_settings import RunSettings
from strategies.wire.plugin_options import NoOptions, PluginError, PluginOptions, Retired
from strategies.wire.registry import Registry

__all__ = ["AGGREGATORS", "CODEC_RATES", "CONTROL_VARIATES", "DEFENCES", "PLUGIN_REGISTRIES",
           "PRUNINGS", "SCHEDULES", "SECURE_AGGREGATION", "SELECTORS", "SERVER_OPTIMIZERS",
           "build", "check", "default_sections", "option_types", "parse_sections",
           "retired_keys"]

_FOLDER = "strategies.plugins"

AGGREGATORS: Registry[type] = Registry("aggregator", "strategy.aggregator",
                                       package=f"{_FOLDER}.aggregators", error=PluginError)
SCHEDULES: Registry[type] = Registry("local-steps schedule", "strategy.schedule",
                                     package=f"{_FOLDER}.schedules", error=PluginError)
SELECTORS: Registry[type] = Registry("client selector", "strategy.selector",
                                     package=f"{_FOLDER}.selectors", error=PluginError)
DEFENCES: Registry[type] = Registry("defence", "strategy.defence",
                                    package=f"{_FOLDER}.defences", error=PluginError)
CODEC_RATES: Registry[type] = Registry("compression-rate schedule", "strategy.codec-rate",
                                       package=f"{_FOLDER}.schedules", error=PluginError)
SECURE_AGGREGATION: Registry[type] = Registry(
    "secure aggregation", "strategy.secure-aggregation",
    package=f"{_FOLDER}.secure_aggregation", error=PluginError)
PRUNINGS: Registry[type] = Registry("pruning", "strategy.pruning",
                                    package=f"{_FOLDER}.pruning", error=PluginError)
CONTROL_VARIATES: Registry[type] = Registry("control variates", "strategy.control-variates",
                                            package=f"{_FOLDER}.control_variates",
                                            error=PluginError)
SERVER_OPTIMIZERS: Registry[type] = Registry("server optimizer", "strategy.server-opt",
                                             package=f"{_FOLDER}.server_opt", error=PluginError)
PLUGIN_REGISTRIES: tuple[Registry[type], ...] = (AGGREGATORS, SCHEDULES, SELECTORS, DEFENCES,
                                                 CODEC_RATES, SECURE_AGGREGATION, PRUNINGS,
                                                 CONTROL_VARIATES, SERVER_OPTIMIZERS)


def option_types(registry: Registry[type]) -> list[type[PluginOptions]]:
    """The options classes of ``registry``'s plug-ins that have a section, by section."""
    types = {plugin.Options for plugin in registry.entries().values()
             if plugin.Options is not NoOptions}
    return sorted(types, key=lambda t: t.section)


def _options_of(plugin: Any, sections: Mapping[str, PluginOptions]) -> PluginOptions:
    options_type = plugin.Options
    return sections.get(options_type.section) or options_type()


def check(registry: Registry[type], name: str, sections: Mapping[str, PluginOptions],
          settings: RunSettings) -> None:
    """Check that plug-in ``name`` exists and suits the rest of the run config.

    Raises
    ------
    PluginError
        For an unknown name (naming the choice key and the known names) or a
        plug-in whose ``requires`` refuses the run config.
    """
    plugin = registry.get(name)
    plugin.requires(_options_of(plugin, sections), settings)


def build(registry: Registry[type], name: str, sections: Mapping[str, PluginOptions],
          settings: RunSettings) -> Any:
    """The plug-in ``name`` for a run: its section's options and the run settings."""
    check(registry, name, sections, settings)
    plugin = registry.get(name)
    return plugin.from_options(_options_of(plugin, sections), settings)


def _section_types() -> dict[str, type[PluginOptions]]:
    types: dict[str, type[PluginOptions]] = {}
    for registry in PLUGIN_REGISTRIES:
        for options_type in option_types(registry):
            other = types.setdefault(options_type.section, options_type)
            if other is not options_type:
                raise PluginError(f"run config section '{options_type.section}' is declared "
                                  f"by {other.__qualname__} and {options_type.__qualname__}")
    return types


def default_sections() -> dict[str, PluginOptions]:
    """Every plug-in section with its defaults, by section name."""
    return {name: options_type() for name, options_type in _section_types().items()}


def retired_keys() -> dict[str, Retired]:
    """Every plug-in section's retired keys, by full key (``fednova.server-momentum``)."""
    return {f"{name}.{key}": retired for name, options_type in _section_types().items()
            for key, retired in options_type.retired.items()}


def parse_sections(values: Mapping[str, Any]) -> tuple[dict[str, PluginOptions], list[str]]:
    """Validate the plug-in sections of a flat run config.

    Parameters
    ----------
    values
        Flower's run config (``{"adacomm.tau-min": 2, "local-steps": 200, ...}``).

    Returns
    -------
    sections, rest
        Every plug-in section's options (defaults where absent), and the keys of
        ``values`` that belong to no plug-in section.

    Raises
    ------
    PluginError
        For an unknown key in a plug-in section or a bad value, naming the key.
    """
    types = _section_types()
    grouped: dict[str, dict[str, Any]] = {name: {} for name in types}
    rest: list[str] = []
    for key, value in values.items():
        section, _, name = key.partition(".")
        if section in types and name:
            grouped[section][name] = value
        else:
            rest.append(key)
    return {name: types[name].from_section(grouped[name]) for name in types}, rest
