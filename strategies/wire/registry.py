"""The one registry type: name -> entry, for every extension point of the product.

Every way to extend the product is an instance of :class:`Registry`:

* the strategy plug-ins (:mod:`strategies.plugins.registries`: aggregators,
  defences, schedules, codec-rate schedules, selectors) and personalisation
  methods, each discovered from its folder of ``strategies/plugins/``;
* the update codecs (:data:`strategies.wire.codecs.registry.CODECS`), discovered from
  ``strategies/wire/codecs/``;
* the imaging tasks (:data:`clients.registry.TASKS`);
* the privacy accountants (:data:`clients.training.dp_accountants.ACCOUNTANTS`),
  registered by dotted path so that listing them imports no Opacus;
* the sites' training options: local optimisers
  (:data:`clients.training.task_settings.OPTIMIZERS`, by dotted path so that listing
  them imports no torch), learning-rate schedules
  (:data:`clients.training.lr_schedule.LR_SCHEDULES`) and augmentation levels
  (:data:`clients.training.augmentation_levels.AUGMENTATIONS`);
* each task's shared real sets (its ``shared`` module's ``SETS``);
* the codecs a consumer takes, by dotted path to their ``CODECS`` entry
  (:data:`strategies.downlink.DOWNLINK_CODECS`, PruneFL's ``REPORT_CODECS``, SecAgg+'s
  :data:`strategies.wire.secure_aggregation.vector.SUMMABLE_CODECS`);
* the best round's robust score rules
  (:data:`strategies.robust.ROBUST_RULES`).

An entry joins a registry in one of three ways:

* by decorator, ``@AGGREGATORS.register("fedavg")`` on a class or function;
* directly, ``CODEC = CODECS.add("none", Codec(...))``;
* lazily by dotted path, ``ACCOUNTANTS.add_path("rdp", "opacus.accountants:RDPAccountant")``:
  the name is listed at once, the module is imported on the first :meth:`Registry.get`.

A registry with a ``package`` imports every module of that package on its
first lookup (the modules register themselves), so dropping a file into a
plug-in folder is all it takes. Looking up an unknown name raises the
registry's :class:`~strategies.wire.errors.ConfigError` branch naming the run-config
key that chose it and the known names.

This module imports only the standard library and :mod:`strategies.wire.errors`, so
the site side (``clients``) and the cheap command lines can use it.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from strategies.wire.errors import ConfigError

__all__ = ["Registry", "import_path"]

T = TypeVar("T")
E = TypeVar("E")


def import_path(path: str) -> Any:
    """The object at ``"package.module:attribute"`` (the module is imported now).

    Raises
    ------
    ConfigError
        If ``path`` has no ``:`` (the attribute is then not named).
    """
    module, _, attribute = path.partition(":")
    if not module or not attribute:
        raise ConfigError(f"dotted path {path!r} must read 'package.module:attribute'")
    return getattr(importlib.import_module(module), attribute)


class Registry(Generic[T]):
    """Entries of one extension point, by name.

    Parameters
    ----------
    kind : str
        What an entry is, for messages (``"aggregator"``, ``"task"``).
    key : str
        The run-config key whose value is looked up here (``"strategy.aggregator"``).
    package : str, optional
        Package whose modules are imported on the first lookup (they register
        themselves); None: entries are registered explicitly.
    error : type of ConfigError
        The branch raised for an unknown name, a name registered twice or bad
        constructor options (:class:`~strategies.wire.plugin_options.PluginError`
        for the plug-ins, :class:`~strategies.wire.codecs.errors.CodecError` for codecs).
    """

    def __init__(self, kind: str, key: str, *, package: str | None = None,
                 error: type[ConfigError] = ConfigError) -> None:
        self.kind, self.key, self.package, self.error = kind, key, package, error
        self._entries: dict[str, T] = {}
        self._paths: dict[str, str] = {}
        self._discovered = package is None

    def register(self, name: str) -> Callable[[E], E]:
        """Decorator adding the decorated class or function as ``name``."""
        def decorate(entry: E) -> E:
            self.add(name, entry)  # type: ignore[arg-type]
            return entry
        return decorate

    def add(self, name: str, entry: T) -> T:
        """Add ``entry`` as ``name`` and return it.

        Raises
        ------
        ConfigError
            (the registry's branch) If ``name`` is registered already.
        """
        self._refuse_twice(name)
        self._entries[name] = entry
        return entry

    def add_path(self, name: str, path: str) -> None:
        """Add ``name`` now and its entry, ``"module:attribute"``, on its first lookup."""
        self._refuse_twice(name)
        self._paths[name] = path

    def _refuse_twice(self, name: str) -> None:
        if name in self._entries or name in self._paths:
            raise self.error(f"{self.kind} '{name}' registered twice")

    def discover(self) -> None:
        """Import every module of the registry's package once (they register themselves)."""
        if self._discovered:
            return
        self._discovered = True  # first: a module being imported may look names up
        try:
            package = importlib.import_module(str(self.package))
            for module in pkgutil.iter_modules(package.__path__):
                importlib.import_module(f"{self.package}.{module.name}")
        except BaseException:
            self._discovered = False  # the next lookup raises the import error again
            raise

    def names(self) -> list[str]:
        """Every registered name, sorted (dotted-path entries are not imported)."""
        self.discover()
        return sorted({*self._entries, *self._paths})

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` is registered (dotted-path entries are not imported)."""
        return name in self.names()

    def __iter__(self) -> Iterator[str]:
        """The registered names, sorted (as :meth:`names`)."""
        return iter(self.names())

    def find(self, name: str) -> T | None:
        """The entry registered as ``name``, or None."""
        self.discover()
        if name in self._paths:
            self._entries[name] = import_path(self._paths[name])
            del self._paths[name]
        return self._entries.get(name)

    def get(self, name: str) -> T:
        """The entry registered as ``name``.

        Raises
        ------
        ConfigError
            (the registry's branch) For an unknown name, naming the run-config
            key and the known names.
        """
        entry = self.find(name)
        if entry is None:
            raise self.error(f"run config key '{self.key}' must be one of {self.names()} "
                             f"({'an' if self.kind[:1] in 'aeiou' else 'a'} {self.kind}), "
                             f"got {name!r}")
        return entry

    def entries(self) -> dict[str, T]:
        """Every entry by name, sorted by name (dotted-path entries are imported)."""
        return {name: self.get(name) for name in self.names()}

    def create(self, name: str, **options: Any) -> Any:
        """Call the entry ``name`` (a class or factory) with keyword ``options``.

        Raises
        ------
        ConfigError
            (the registry's branch) For an unknown name or options the entry refuses.
        """
        factory: Any = self.get(name)
        try:
            return factory(**options)
        except ConfigError:
            raise
        except (TypeError, ValueError) as exc:
            raise self.error(f"{self.kind} '{name}': {exc}") from exc
