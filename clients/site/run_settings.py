"""What a site reads of the run config: the task, its sizes, the optimiser, DP, personalisation.

The ClientApp adapter (:mod:`app.client_app`) and ``make predict PERSONAL=...``
build it with :meth:`SiteRunSettings.from_run_config` from Flower's run config;
the site's round (:mod:`clients.site.site_round`) reads it. Only the keys a site
uses are parsed: the ``site`` and ``both`` keys of the one run-config table
(:data:`strategies.wire.run_keys.RUN_KEYS`), whose types, defaults and ranges this view
and the server's (:class:`app.config.run_config.RunConfig`) share, their registry
choices checked against the site side's names
(:data:`clients.training.task_settings.SITE_CHOICES`); errors name the key. The
server validated the whole run config before the run started, rules between keys
included, and a site trusts none of it anyway: it checks every request against its
own policy. A missing key keeps the table's default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Any

from clients.training.lr_schedule import CONSTANT, round_lr
from clients.training.private_training import DpSettings
from clients.training.site_task import TaskSettings
from clients.training.task_settings import SITE_CHOICES
from strategies.wire.personalisation_options import PersonalisationOptions, split_personalisation
from strategies.wire.run_keys import RUN_KEYS, check, run_key, typed

__all__ = ["SiteRunSettings"]


def _read(values: Mapping[str, Any], key: str) -> Any:
    """``values[key]`` typed and checked (:mod:`strategies.wire.run_keys`), else its default."""
    value = typed(key, values[key]) if key in values else RUN_KEYS[key].default
    check(key, value, SITE_CHOICES.get(key, ()))
    return value


def _keyed(kind: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """``kind``'s run-config fields (those declared with :func:`run_key`), read from ``values``."""
    return {f.name: _read(values, f.metadata["key"]) for f in fields(kind) if "key" in f.metadata}


@dataclass(frozen=True)
class SiteRunSettings:
    """The run's settings a site's round uses (run-config keys in the comments)."""

    #: ``task``: the registered task name.
    task: str = run_key("task")
    #: ``image-size``, ``batch-size``, ... of the task.
    sizes: TaskSettings = field(default_factory=TaskSettings)
    #: ``local-steps``: tau when an instruction names none.
    local_steps: int = run_key("local-steps")
    #: ``optimizer``, ``lr``, ``momentum``: the local solver.
    optimizer: str = run_key("optimizer")
    lr: float = run_key("lr")
    momentum: float = run_key("momentum")
    #: ``seed``: the run seed (:func:`strategies.wire.seeds.site_seed`).
    seed: int = run_key("seed")
    #: ``num-server-rounds``: a train message after the last round is the final fine-tuning.
    num_server_rounds: int = run_key("num-server-rounds")
    #: ``lr-schedule``, ``lr-floor``: the rate over the rounds
    #: (:mod:`clients.training.lr_schedule`).
    lr_schedule: str = run_key("lr-schedule")
    lr_floor: float = run_key("lr-floor")
    #: ``time-budget``: seconds of local training when an instruction names none (0 = none).
    time_budget: float = run_key("time-budget")
    #: ``proximal-mu``: FedProx's proximal term (0 = none).
    proximal_mu: float = run_key("proximal-mu")
    #: ``data-root``: simulation only, the virtual sites' data folder ("" = node_config's).
    data_root: str = run_key("data-root")
    #: ``site-policy``: simulation only, the virtual sites' policy file ("" = node_config's).
    site_policy: str = run_key("site-policy")
    #: ``privacy.*``: DP-SGD (noise multiplier 0 = none).
    privacy: DpSettings = field(default_factory=DpSettings)
    #: ``personalisation.*``: the method and its sizes.
    personalisation: PersonalisationOptions = field(default_factory=PersonalisationOptions)

    @classmethod
    def from_run_config(cls, values: Mapping[str, Any]) -> SiteRunSettings:
        """The site's keys of Flower's run config (``local-steps``, ``privacy.delta``, ...).

        Other keys are the server's and are not read; a missing key keeps its default.

        Raises
        ------
        ConfigError
            Naming the key, for a value of the wrong type or out of range.
        PluginError
            For a bad ``personalisation.*`` key, naming it.

        A run's config does not change from one message to the next: the settings of a
        config already read are reused (read once per process and config; a refused one is
        read, and refused, again).
        """
        try:
            # each value with its type: 1, 1.0 and True are equal keys, not the same entry
            items = tuple(sorted((key, type(value).__name__, value)
                                 for key, value in values.items()))
            hash(items)
        except TypeError:  # a value that is not hashable: read every time
            return cls._parse(values)
        return _parsed(cls, items)

    @classmethod
    def _parse(cls, values: Mapping[str, Any]) -> SiteRunSettings:
        """:meth:`from_run_config`, read."""
        personal = (split_personalisation(values)[0]
                    if any(k.startswith("personalisation.") for k in values)
                    else PersonalisationOptions())
        return cls(sizes=TaskSettings(**_keyed(TaskSettings, values)),
                   privacy=DpSettings(**_keyed(DpSettings, values)), personalisation=personal,
                   **_keyed(cls, values))

    @property
    def dp_sgd(self) -> bool:
        """Whether local training is DP-SGD (``privacy.noise-multiplier`` > 0: what
        :attr:`DpSettings.enabled` says, read here so that a run without DP-SGD does not
        enter the DP code to learn it)."""
        return self.privacy.noise_multiplier > 0

    def round_lr(self, server_round: int) -> float:
        """The local learning rate of round ``server_round`` (``lr`` under ``lr-schedule``;
        a constant schedule's is ``lr`` itself, not looked up)."""
        if self.lr_schedule == CONSTANT:
            return self.lr
        return round_lr(self.lr, self.lr_schedule, server_round, self.num_server_rounds,
                        self.lr_floor)


@lru_cache(maxsize=16)
def _parsed(kind: type[SiteRunSettings],
            items: tuple[tuple[str, str, Any], ...]) -> SiteRunSettings:
    """The settings of the run config ``items`` (``(key, type name, value)``, sorted), read
    once."""
    return kind._parse({key: value for key, _, value in items})
