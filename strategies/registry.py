"""Name -> plug-in registries, so a new plug-in is one new file.

Each kind of plug-in (aggregator, local-steps schedule, client selector) has a
:class:`Registry`. A plug-in module in ``strategies/plugins/`` registers its
class with ``@REGISTRY.register("name")``; every module of that package is
imported on first use, so dropping a file there is all it takes.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any, Generic, TypeVar
from strategies.errors import ConfigError

__all__ = ["PluginError", "Registry", "AGGREGATORS", "SCHEDULES", "SELECTORS"]

T = TypeVar("T")


class PluginError(ConfigError):
    """Unknown plug-in name or bad plug-in options."""


class Registry(Generic[T]):
    """Plug-ins of one kind, by name."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Class decorator registering a plug-in under ``name``."""
        def decorate(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._factories:
                raise PluginError(f"{self.kind} '{name}' registered twice")
            self._factories[name] = factory
            return factory
        return decorate

    def names(self) -> list[str]:
        """Registered names, sorted."""
        _discover()
        return sorted(self._factories)

    def create(self, name: str, **options: Any) -> T:
        """Instantiate the plug-in ``name`` with ``options``.

        Raises
        ------
        PluginError
            For an unknown name, with the list of known ones.
        """
        _discover()
        if name not in self._factories:
            raise PluginError(f"unknown {self.kind} '{name}'; choose one of {self.names()}")
        try:
            return self._factories[name](**options)
        except (TypeError, ValueError) as exc:
            raise PluginError(f"{self.kind} '{name}': {exc}") from exc


AGGREGATORS: Registry = Registry("aggregator")
SCHEDULES: Registry = Registry("local-steps schedule")
SELECTORS: Registry = Registry("client selector")

_DISCOVERED: list[bool] = []


def _discover() -> None:
    """Import every module of ``strategies.plugins`` once (they register themselves)."""
    if _DISCOVERED:
        return
    _DISCOVERED.append(True)
    package = importlib.import_module("strategies.plugins")
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"strategies.plugins.{module.name}")
