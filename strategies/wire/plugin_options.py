"""Typed plug-in options: one frozen dataclass per run-config section.

A plug-in declares ``Options``, a frozen dataclass subclassing
:class:`PluginOptions` whose ``section`` names its run-config section; each field
is one key of that section, spelled with dashes (``adacomm.tau-min`` is field
``tau_min`` of the section ``adacomm``). Fields are declared with :func:`option`,
which gives the default and the allowed range; the type is the default's type
(``int``, ``float``, ``bool`` or ``str``; an int widens to a float). Building the
dataclass validates it, and every error names the full key::

    run config key 'adacomm.tau-min' must be an int >= 1, got 'x'

Rules that relate two keys of the section go in :meth:`PluginOptions.check`.
A key a section no longer has is declared in its ``retired`` (:class:`Retired`): set
in a run config, it is refused naming what replaced it; in an older checkpoint's run
config its neutral value is no difference (:func:`strategies.rounds.checkpoint.config_difference`).
What a plug-in reads from the rest of the run config (the local steps, the
number of rounds, the seed, ...) is :class:`strategies.plugins.run_settings.RunSettings`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from strategies.wire.errors import ConfigError

__all__ = ["NoOptions", "Plugin", "PluginError", "PluginOptions", "Retired", "option",
           "typed_value"]

_KINDS = {bool: "a bool", int: "an int", float: "a float", str: "a string"}


class PluginError(ConfigError):
    """Unknown plug-in, or a plug-in option unknown, mistyped or out of range (names the key)."""


def typed_value(value: Any, kind: type) -> Any:
    """``value`` as a ``kind`` run-config value: an int widens to a float, a bool is no number.

    Raises
    ------
    TypeError
        If ``value`` is not a ``kind``.
    """
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise TypeError(f"expected {kind.__name__}, got {value!r}")
    return value


def option(default: Any, *, at_least: float | None = None, below: float | None = None) -> Any:
    """A plug-in option field: its default and the range ``at_least <= value < below``."""
    return field(default=default, metadata={"at_least": at_least, "below": below})


def _rule(kind: type, at_least: float | None, below: float | None) -> str:
    text = _KINDS[kind]
    if at_least is not None and below is not None:
        return f"{text} in [{at_least:g}, {below:g})"
    if at_least is not None:
        return f"{text} >= {at_least:g}"
    if below is not None:
        return f"{text} < {below:g}"
    return text


@dataclass(frozen=True)
class Retired:
    """A key a section once had: the value that changed nothing, and what replaced it."""

    #: Its value that was the behaviour without it (a checkpoint with it resumes).
    neutral: Any
    #: What a run config sets instead (the refusal's advice).
    instead: str


@dataclass(frozen=True)
class PluginOptions:
    """Base of a plug-in's options; subclasses are frozen dataclasses of :func:`option` fields."""

    section: ClassVar[str] = ""
    #: Keys the section no longer has (dashed name -> :class:`Retired`).
    retired: ClassVar[Mapping[str, Retired]] = {}

    def __post_init__(self) -> None:
        for f in fields(self):
            kind = type(f.default)
            at_least, below = f.metadata.get("at_least"), f.metadata.get("below")
            try:
                value = typed_value(getattr(self, f.name), kind)
            except TypeError:
                value = None
            if (value is None or (at_least is not None and value < at_least)
                    or (below is not None and value >= below)):
                self.fail(f.name, f"must be {_rule(kind, at_least, below)}")
            object.__setattr__(self, f.name, value)
        self.check()

    def check(self) -> None:
        """Rules between the section's keys; raise with :meth:`fail`."""

    def fail(self, name: str, rule: str) -> None:
        """Raise :class:`PluginError` naming the full key of field ``name``."""
        raise PluginError(f"run config key '{self.key(name)}' {rule}, "
                          f"got {getattr(self, name)!r}")

    @classmethod
    def key(cls, name: str) -> str:
        """Full run-config key of field ``name`` (``tau_min`` -> ``adacomm.tau-min``)."""
        return f"{cls.section}.{name.replace('_', '-')}"

    @classmethod
    def from_section(cls, values: Mapping[str, Any]) -> PluginOptions:
        """Build from the section's keys (``{"tau-min": 2}``); missing keys keep defaults.

        Raises
        ------
        PluginError
            For a retired key (named in full, with what replaced it), a key the section
            does not have (named in full, with the known ones) or a value of the wrong
            type or out of range.
        """
        retired = sorted(set(values) & set(cls.retired))
        if retired:
            raise PluginError(f"run config key '{cls.section}.{retired[0]}' was retired: "
                              f"{cls.retired[retired[0]].instead}")
        known = {f.name.replace("_", "-"): f.name for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise PluginError(f"unknown run config key '{cls.section}.{unknown[0]}'; "
                              f"section '{cls.section}' has {sorted(known)}")
        return cls(**{known[k]: v for k, v in values.items()})

    @classmethod
    def split_from(cls, values: Mapping[str, Any]) -> tuple[PluginOptions, dict[str, Any]]:
        """The section's options from a flat run config (``{"adacomm.tau-min": 2, ...}``),
        and the run config's other keys.

        Raises
        ------
        PluginError
            For an unknown key of the section or a bad value, naming the full key.
        """
        prefix = f"{cls.section}."
        section = {k[len(prefix):]: v for k, v in values.items() if k.startswith(prefix)}
        rest = {k: v for k, v in values.items() if not k.startswith(prefix)}
        return cls.from_section(section), rest

    def as_params(self) -> dict[str, Any]:
        """``{full key: value}`` for every option (MLflow params)."""
        return {self.key(f.name): getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class NoOptions(PluginOptions):
    """The options of a plug-in that has none (no run-config section)."""


class Plugin:
    """Base of a plug-in class: its ``Options``, the default way to build it and to check it.

    Meets :class:`strategies.plugins.protocols.PluginClass`. The default
    :meth:`from_options` passes each option field as the keyword of the same
    name (``min_steps_fraction`` -> ``__init__(min_steps_fraction=...)``); a plug-in
    that also reads the rest of the run config overrides it. The default
    :meth:`requires` accepts any run config.
    """

    Options: ClassVar[type[PluginOptions]] = NoOptions

    @staticmethod
    def requires(options: PluginOptions, settings: Any) -> None:
        """Refuse a run config the plug-in cannot serve (``PluginError``); this one serves any."""

    @classmethod
    def from_options(cls, options: PluginOptions, settings: Any) -> Any:
        """The plug-in for a run: ``cls(**options)``."""
        return cls(**{f.name: getattr(options, f.name) for f in fields(options)})
