"""The run config's flat keys, once: type, default, range or choices, and who reads them.

:data:`RUN_KEYS` is the one table of the keys of ``[tool.flwr.app.config]`` that are
not a plug-in's (``local-steps``, ``privacy.delta``, ``strategy.aggregator``, ...): each
:class:`RunKey` holds the key, its default (pyproject.toml's, whose type is the key's:
an int widens to a float), its check (a :class:`Range`, or literal ``choices``) and the
side that reads it (:data:`Side`). Both typed views are generated from it: the server's
:class:`app.config.run_config.RunConfig` (every key) and the site's
:class:`clients.site.instruction.SiteRunSettings` (the ``site`` and ``both`` keys) declare
their fields with :func:`run_key` and check each value with :func:`typed` and
:func:`check`; a test holds the table equal to pyproject.toml.

The plug-in sections (``fednova.*``, ``selection.*``, ``pruning.*``,
``personalisation.*``, ``vertical.*``, ...) are not here: each plug-in declares its own
typed options (:mod:`strategies.wire.plugin_options`).

Choices that live in a registry are named by ``registry`` and checked by the side
that owns it, which hands the names to :func:`check`: the site side's registries in
``clients/`` (``task``, ``optimizer``, ``lr-schedule``, ``augmentation``,
``privacy.accountant``: :data:`clients.training.task_settings.SITE_CHOICES`, the server
adds ``task`` and ``best-round.aggregate``), the plug-ins' choices (``strategy.*``) by
:func:`strategies.plugins.registries.check`, the codec specs by their parsers. Rules
between keys (``proximal-mu`` needs ``optimizer = "sgd"``, ...) are the server's
(:meth:`app.config.run_config.RunConfig.validate`).

Pure (stdlib and the pure modules it imports): the site side imports it (tests/test_layering.py).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from strategies.wire.errors import ConfigError
from strategies.wire.plugin_options import typed_value
from strategies.wire.vertical_options import FEDERATION_KINDS

__all__ = ["RUN_KEYS", "Range", "RunKey", "Side", "check", "run_key", "site_keys", "typed"]

#: Who reads a key: only the server, only the sites (the server validates and logs it),
#: or both.
Side = Literal["server", "site", "both"]


@dataclass(frozen=True)
class Range:
    """A number's allowed values: ``low`` .. ``high`` (open or closed ends), and more.

    Attributes
    ----------
    low, high : float or None
        The bounds (None: unbounded).
    open_low, open_high : bool
        Whether the bound itself is excluded (``> 0``, ``< 1``).
    off : bool
        Whether 0 is allowed too, outside the range (``0 (off) or >= 1``).
    odd : bool
        Whether the value must be odd (``slab-slices``).
    multiple : int
        A number the value must be a multiple of (0: none).
    note : str
        What the bounds mean, appended to the rule (``(0 = no DP-SGD)``).
    """

    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    off: bool = False
    odd: bool = False
    multiple: int = 0
    note: str = ""

    def _rule(self) -> str:
        if self.low is not None and self.high is not None:
            rule = (f"in {'(' if self.open_low else '['}{self.low:g}, {self.high:g}"
                    f"{')' if self.open_high else ']'}")
        elif self.low is not None:
            rule = f"{'>' if self.open_low else '>='} {self.low:g}"
        else:
            rule = f"{'<' if self.open_high else '<='} {self.high:g}"
        rule = f"odd and {rule}" if self.odd else f"0 (off) or {rule}" if self.off else rule
        return f"must be {rule}{f' {self.note}' if self.note else ''}"

    def problem(self, value: float) -> str | None:
        """The rule ``value`` breaks (``"must be > 0"``), or None."""
        inside = ((self.low is None or (value > self.low if self.open_low else value >= self.low))
                  and (self.high is None
                       or (value < self.high if self.open_high else value <= self.high)))
        if not (inside or (self.off and value == 0)) or (self.odd and value % 2 == 0):
            return self._rule()
        if self.multiple and value % self.multiple:
            return f"must be a multiple of {self.multiple}"
        return None


_POSITIVE = Range(0, open_low=True)
_NON_NEGATIVE = Range(0)


@dataclass(frozen=True)
class RunKey:
    """One flat run-config key.

    Attributes
    ----------
    key : str
        The key as spelt in pyproject.toml (``local-steps``, ``privacy.delta``).
    default : bool, int, float or str
        pyproject.toml's default; its type is the key's.
    side : Side
        Who reads it.
    range : Range or None
        The allowed numbers (None: any).
    choices : tuple of str
        The allowed names, where they are fixed here (empty: any, or ``registry``'s).
    registry : str
        The registry holding the allowed names, checked by the side that owns it
        ("": none).
    """

    key: str
    default: bool | int | float | str
    side: Side
    range: Range | None = None
    choices: tuple[str, ...] = ()
    registry: str = ""

    @property
    def kind(self) -> type:
        """The value's type: the default's."""
        return type(self.default)


def _keys(*keys: RunKey) -> dict[str, RunKey]:
    return {k.key: k for k in keys}


_PLUGINS = "strategies.plugins.registries"
#: Every flat run-config key, in pyproject.toml's order.
RUN_KEYS: Mapping[str, RunKey] = _keys(
    RunKey("task", "pe-seg", "both", registry="clients.registry.TASKS"),
    RunKey("num-server-rounds", 6, "both", _POSITIVE),
    RunKey("local-steps", 200, "both", _POSITIVE),
    RunKey("batch-size", 8, "both", _POSITIVE),
    RunKey("optimizer", "adam", "both", registry="clients.training.task_settings.OPTIMIZERS"),
    RunKey("lr", 0.003, "both", _POSITIVE),
    RunKey("lr-schedule", "constant", "site",
           registry="clients.training.lr_schedule.LR_SCHEDULES"),
    RunKey("lr-floor", 0.0, "site", Range(0, 1, note="(a fraction of lr)")),
    RunKey("momentum", 0.9, "both", Range(0, 1, open_high=True)),
    RunKey("proximal-mu", 0.0, "both", _NON_NEGATIVE),
    RunKey("time-budget", 0.0, "both", _NON_NEGATIVE),
    RunKey("image-size", 64, "both", Range(0, open_low=True, multiple=8)),
    RunKey("slab-slices", 9, "both", Range(1, odd=True)),
    RunKey("num-labels", 1, "both", _POSITIVE),
    RunKey("model-size", "small", "both", choices=("small", "full")),
    RunKey("volume-depth", 32, "both", _POSITIVE),
    RunKey("augmentation", "none", "site",
           registry="clients.training.augmentation_levels.AUGMENTATIONS"),
    RunKey("data-root", "", "site"),
    RunKey("tracking-uri", "", "server"),
    RunKey("artifact-root", "", "server"),
    RunKey("experiment", "", "server"),
    RunKey("checkpoint-dir", "", "server"),
    RunKey("resume", False, "server"),
    RunKey("tracking.end-wait-s", 60.0, "server", Range(0, note="(0 = one try, no wait)")),
    RunKey("site-policy", "", "site"),
    RunKey("app-signature", "", "site"),
    RunKey("min-nodes", 2, "server", _POSITIVE),
    RunKey("fraction-train", 1.0, "server", Range(0, 1, open_low=True)),
    RunKey("fraction-evaluate", 1.0, "server", Range(0, 1)),
    RunKey("node-wait-timeout", 120.0, "server", _POSITIVE),
    RunKey("round-timeout", 600.0, "server", _POSITIVE),
    RunKey("seed", 0, "both"),
    RunKey("strategy.aggregator", "fedavg", "server", registry=f"{_PLUGINS}.AGGREGATORS"),
    RunKey("strategy.schedule", "fixed", "server", registry=f"{_PLUGINS}.SCHEDULES"),
    RunKey("strategy.selector", "uniform", "server", registry=f"{_PLUGINS}.SELECTORS"),
    RunKey("strategy.defence", "norm-bound", "server", registry=f"{_PLUGINS}.DEFENCES"),
    RunKey("strategy.codec", "none", "server", registry="strategies.wire.codecs.parse_spec"),
    RunKey("strategy.codec-warmup-rounds", 0, "server"),
    RunKey("strategy.codec-rate", "fixed", "server", registry=f"{_PLUGINS}.CODEC_RATES"),
    RunKey("strategy.error-feedback", True, "server"),
    RunKey("strategy.downlink-codec", "none", "server",
           registry="strategies.downlink.check_downlink_codec"),
    RunKey("strategy.secure-aggregation", "none", "server",
           registry=f"{_PLUGINS}.SECURE_AGGREGATION"),
    RunKey("strategy.pruning", "none", "server", registry=f"{_PLUGINS}.PRUNINGS"),
    RunKey("strategy.control-variates", "none", "server",
           registry=f"{_PLUGINS}.CONTROL_VARIATES"),
    RunKey("strategy.server-opt", "sgd", "server", registry=f"{_PLUGINS}.SERVER_OPTIMIZERS"),
    RunKey("round.deadline", 0.0, "server", _NON_NEGATIVE),
    RunKey("round.quorum", 0, "server", _NON_NEGATIVE),
    RunKey("round.max-held-mb", 4096.0, "server", _POSITIVE),
    RunKey("federation.roster", "", "server"),
    RunKey("federation.max-size-ratio", 3.0, "server", Range(1, off=True)),
    RunKey("federation.min-contributing-sites", 0, "server",
           Range(0, note="(0 = every site a round trains)")),
    RunKey("federation.kind", "horizontal", "server", choices=FEDERATION_KINDS),
    RunKey("privacy.noise-multiplier", 0.0, "both", Range(0, note="(0 = no DP-SGD)")),
    RunKey("privacy.max-grad-norm", 1.0, "site", _POSITIVE),
    RunKey("privacy.delta", 1e-5, "site", Range(0, 1, open_low=True, open_high=True)),
    RunKey("privacy.accountant", "rdp", "site",
           registry="clients.training.dp_accountants.ACCOUNTANTS"),
    RunKey("early-stopping.patience", 0, "server", _NON_NEGATIVE),
    RunKey("early-stopping.min-delta", 0.0, "server", _NON_NEGATIVE),
    RunKey("best-round.aggregate", "auto", "server",
           registry="strategies.robust.SCORE_RULES"),
    RunKey("initial-model", "", "server"),
    RunKey("final-evaluation", True, "server"),
    RunKey("cross-site.finetune-steps", 2, "server",
           Range(0, note="(0 = only the global model)")),
)


def site_keys() -> tuple[str, ...]:
    """The keys a site reads (side ``site`` or ``both``)."""
    return tuple(key for key, entry in RUN_KEYS.items() if entry.side != "server")


def run_key(key: str) -> Any:
    """A dataclass field of ``key``: the table's default, the key in its metadata."""
    return field(default=RUN_KEYS[key].default, metadata={"key": key})


def typed(key: str, value: Any, error: type[ConfigError] = ConfigError) -> Any:
    """``value`` as ``key``'s type (an int widens to a float, a bool is no number).

    Raises
    ------
    ConfigError
        ``error``, naming the key, for a value of another type.
    """
    kind = RUN_KEYS[key].kind
    try:
        return typed_value(value, kind)
    except TypeError:
        raise error(f"run-config '{key}' must be {kind.__name__}, got {value!r}") from None


def check(key: str, value: Any, choices: Collection[str] = (),
          error: type[ConfigError] = ConfigError) -> None:
    """Check ``value`` against ``key``'s range or choices (``choices``: its registry's names).

    Raises
    ------
    ConfigError
        ``error``, naming the key and the rule: ``run-config 'lr' must be > 0, got -1.0``.
    """
    entry = RUN_KEYS[key]
    names = entry.choices or tuple(choices)
    problem = entry.range.problem(value) if entry.range is not None else None
    if problem is None and names and value not in names:
        problem = f"must be one of {list(names)}"
    if problem is not None:
        raise error(f"run-config '{key}' {problem}, got {value!r}")
