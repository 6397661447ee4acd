"""Name -> plug-in registries: a new plug-in is one new file (and its defaults in pyproject).

Each kind of plug-in has a :class:`Registry` that owns one folder of
``strategies/plugins/`` and one run-config choice key:

* ``AGGREGATORS``: ``strategies/plugins/aggregators/``, chosen by ``strategy.aggregator``;
* ``SCHEDULES``: ``strategies/plugins/schedules/``, chosen by ``strategy.schedule``;
* ``CODEC_RATES``: the compression-rate schedules in the same folder, chosen by
  ``strategy.codec-rate`` (the kept fraction of the uplink codec per round);
* ``SELECTORS``: ``strategies/plugins/selectors/``, chosen by ``strategy.selector``;
* ``DEFENCES``: ``strategies/plugins/defences/``, chosen by ``strategy.defence``
  (what is done to the accepted replies before the aggregator: norm bound, Multi-Krum).

A plug-in module registers its class with ``@REGISTRY.register("name")``; every
module of the folder is imported on first use, so dropping a file there is all
it takes. A plug-in class (usually a :class:`~strategies.plugins.options.Plugin`)
provides (see ``plugins/aggregators/fednova.py``):

* ``Options``: its typed options, a :class:`~strategies.plugins.options.PluginOptions`
  dataclass naming its run-config section (:class:`NoOptions` when it has none);
* ``from_options(options, settings)``: the instance for a run (``Plugin``'s default
  passes each option as the ``__init__`` keyword of the same name);
* optionally ``requires(options, settings)``: a check against the rest of the run
  config (FedNova's needs ``optimizer = "sgd"``), raising :class:`PluginError`.

:func:`parse_sections` validates every plug-in section of a run config, so the
run config itself names no plug-in.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from strategies.plugins.options import NoOptions, PluginError, PluginOptions
from strategies.plugins.run_settings import RunSettings

__all__ = ["PluginError", "Registry", "AGGREGATORS", "SCHEDULES", "SELECTORS", "DEFENCES",
           "CODEC_RATES", "REGISTRIES", "default_sections", "parse_sections"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Plug-ins of one kind, by name, discovered from one package."""

    def __init__(self, kind: str, package: str, choice_key: str) -> None:
        self.kind, self.package, self.choice_key = kind, package, choice_key
        self._factories: dict[str, Any] = {}
        self._discovered = False

    def register(self, name: str) -> Callable[[type], type]:
        """Class decorator registering a plug-in under ``name``."""
        def decorate(factory: type) -> type:
            if name in self._factories:
                raise PluginError(f"{self.kind} '{name}' registered twice")
            self._factories[name] = factory
            return factory
        return decorate

    def _discover(self) -> None:
        """Import every module of the registry's package once (they register themselves)."""
        if self._discovered:
            return
        self._discovered = True
        package = importlib.import_module(self.package)
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{self.package}.{module.name}")

    def names(self) -> list[str]:
        """Registered names, sorted."""
        self._discover()
        return sorted(self._factories)

    def plugin(self, name: str) -> Any:
        """The class registered as ``name``.

        Raises
        ------
        PluginError
            For an unknown name, naming the choice key and the known names.
        """
        self._discover()
        if name not in self._factories:
            raise PluginError(f"run config key '{self.choice_key}' must be one of "
                              f"{self.names()} (a {self.kind}), got {name!r}")
        return self._factories[name]

    def option_types(self) -> list[type[PluginOptions]]:
        """The options classes of the registered plug-ins that have a section, by section."""
        self._discover()
        types = {f.Options for f in self._factories.values() if f.Options is not NoOptions}
        return sorted(types, key=lambda t: t.section)

    def create(self, name: str, **options: Any) -> T:
        """Instantiate ``name`` with constructor keywords (tests, benchmarks).

        Raises
        ------
        PluginError
            For an unknown name or bad options.
        """
        factory = self.plugin(name)
        try:
            return factory(**options)
        except PluginError:
            raise
        except (TypeError, ValueError) as exc:
            raise PluginError(f"{self.kind} '{name}': {exc}") from exc

    def check(self, name: str, sections: Mapping[str, PluginOptions],
              settings: RunSettings) -> None:
        """Check that ``name`` exists and suits the rest of the run config."""
        factory = self.plugin(name)
        requires = getattr(factory, "requires", None)
        if requires is not None:
            requires(_options_of(factory, sections), settings)

    def build(self, name: str, sections: Mapping[str, PluginOptions],
              settings: RunSettings) -> T:
        """The plug-in ``name`` for a run: its section's options and the run settings."""
        self.check(name, sections, settings)
        factory = self.plugin(name)
        return factory.from_options(_options_of(factory, sections), settings)


def _options_of(factory: Any, sections: Mapping[str, PluginOptions]) -> PluginOptions:
    options_type = factory.Options
    return sections.get(options_type.section) or options_type()


AGGREGATORS: Registry = Registry("aggregator", "strategies.plugins.aggregators",
                                 "strategy.aggregator")
SCHEDULES: Registry = Registry("local-steps schedule", "strategies.plugins.schedules",
                               "strategy.schedule")
SELECTORS: Registry = Registry("client selector", "strategies.plugins.selectors",
                               "strategy.selector")
DEFENCES: Registry = Registry("defence", "strategies.plugins.defences", "strategy.defence")
CODEC_RATES: Registry = Registry("compression-rate schedule", "strategies.plugins.schedules",
                                 "strategy.codec-rate")
REGISTRIES: tuple[Registry, ...] = (AGGREGATORS, SCHEDULES, SELECTORS, DEFENCES, CODEC_RATES)


def _section_types() -> dict[str, type[PluginOptions]]:
    types: dict[str, type[PluginOptions]] = {}
    for registry in REGISTRIES:
        for options_type in registry.option_types():
            other = types.setdefault(options_type.section, options_type)
            if other is not options_type:
                raise PluginError(f"run config section '{options_type.section}' is declared "
                                  f"by {other.__qualname__} and {options_type.__qualname__}")
    return types


def default_sections() -> dict[str, PluginOptions]:
    """Every plug-in section with its defaults, by section name."""
    return {name: options_type() for name, options_type in _section_types().items()}


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
