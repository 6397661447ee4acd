"""What a site reads of the run config: the task, its sizes, the optimiser, DP, personalisation.

The ClientApp adapter (:mod:`app.client_app`) and ``make predict PERSONAL=...``
build it with :meth:`SiteRunSettings.from_run_config` from Flower's run config;
the site's round (:mod:`clients.site.site_round`) reads it. Only the keys a site
uses are parsed (typed, ranges checked, errors naming the key): the server
validated the whole run config before the run started
(:meth:`app.config.run_config.RunConfig.from_mapping`), and a site trusts none of
it anyway, it checks every request against its own policy. A missing key keeps the
run config's default (a test holds them equal).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from clients.training.augmentation_levels import AUGMENTATIONS
from clients.training.dp_accountants import ACCOUNTANTS
from clients.training.lr_schedule import LR_SCHEDULES, round_lr
from clients.training.private_training import DpSettings
from clients.training.site_task import TaskSettings
from clients.training.task_settings import OPTIMIZERS
from strategies.errors import ConfigError
from strategies.plugins.options import typed_value
from strategies.plugins.personalisation.options import (PersonalisationOptions,
                                                        split_personalisation)

__all__ = ["SiteRunSettings"]

#: Run-config keys of :class:`TaskSettings` (``positive_fraction`` stays the task's).
_TASK_KEYS = ("image-size", "slab-slices", "batch-size", "num-labels", "model-size",
              "volume-depth", "augmentation")
#: The task keys that are names, not sizes (no range check).
_NAMED_TASK_KEYS = ("model-size", "augmentation")
#: The run config's defaults of the site's keys that have no default below (pyproject.toml).
_DEFAULTS: dict[str, Any] = {"task": "pe-seg", "local-steps": 200, "optimizer": "adam",
                             "lr": 0.003, "momentum": 0.9, "seed": 0, "num-server-rounds": 6}
#: Run-config key -> :class:`DpSettings` field.
_DP_KEYS = {"privacy.noise-multiplier": "noise_multiplier",
            "privacy.max-grad-norm": "max_grad_norm", "privacy.delta": "delta",
            "privacy.accountant": "accountant"}


def _read(values: Mapping[str, Any], key: str, default: Any) -> Any:
    """``values[key]`` of ``default``'s type (an int widens to a float), else ``default``."""
    if key not in values:
        return default
    try:
        return typed_value(values[key], type(default))
    except TypeError:
        raise ConfigError(f"run-config '{key}' must be {type(default).__name__}, "
                          f"got {values[key]!r}") from None


def _require(ok: bool, key: str, rule: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"run-config '{key}' {rule}, got {value!r}")


@dataclass(frozen=True)
class SiteRunSettings:
    """The run's settings a site's round uses (run-config keys in the comments)."""

    #: ``task``: the registered task name.
    task: str
    #: ``image-size``, ``batch-size``, ... of the task.
    sizes: TaskSettings
    #: ``local-steps``: tau when an instruction names none.
    local_steps: int
    #: ``optimizer``, ``lr``, ``momentum``: the local solver.
    optimizer: str
    lr: float
    momentum: float
    #: ``seed``: the run seed (:func:`strategies.seeds.site_seed`).
    seed: int
    #: ``num-server-rounds``: a train message after the last round is the final fine-tuning.
    num_server_rounds: int
    #: ``lr-schedule``, ``lr-floor``: the rate over the rounds
    #: (:mod:`clients.training.lr_schedule`).
    lr_schedule: str = "constant"
    lr_floor: float = 0.0
    #: ``time-budget``: seconds of local training when an instruction names none (0 = none).
    time_budget: float = 0.0
    #: ``proximal-mu``: FedProx's proximal term (0 = none).
    proximal_mu: float = 0.0
    #: ``data-root``: simulation only, the virtual sites' data folder ("" = node_config's).
    data_root: str = ""
    #: ``site-policy``: simulation only, the virtual sites' policy file ("" = node_config's).
    site_policy: str = ""
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
        """
        default = cls(sizes=TaskSettings(),
                      **{key.replace("-", "_"): value for key, value in _DEFAULTS.items()})
        scalars = {f.name: _read(values, f.name.replace("_", "-"), getattr(default, f.name))
                   for f in fields(cls) if f.name not in ("sizes", "privacy", "personalisation")}
        sizes = TaskSettings(**{k.replace("-", "_"): _read(values, k, getattr(
            default.sizes, k.replace("-", "_"))) for k in _TASK_KEYS})
        privacy = DpSettings(**{name: _read(values, key, getattr(default.privacy, name))
                                for key, name in _DP_KEYS.items()})
        personal = (split_personalisation(values)[0]
                    if any(k.startswith("personalisation.") for k in values)
                    else default.personalisation)
        run = {key: scalars[key.replace("-", "_")] for key in
               ("local-steps", "num-server-rounds", "lr", "time-budget", "proximal-mu")}
        run.update({key: getattr(sizes, key.replace("-", "_")) for key in _TASK_KEYS
                    if key not in _NAMED_TASK_KEYS})
        for key, value in run.items():
            floor = key in ("time-budget", "proximal-mu")
            _require(value >= 0 if floor else value > 0, key,
                     "must be >= 0" if floor else "must be > 0", value)
        _require(0.0 <= scalars["momentum"] < 1.0, "momentum", "must be in [0, 1)",
                 scalars["momentum"])
        _require(scalars["optimizer"] in OPTIMIZERS, "optimizer",
                 f"must be one of {list(OPTIMIZERS)}", scalars["optimizer"])
        _require(scalars["lr_schedule"] in LR_SCHEDULES, "lr-schedule",
                 f"must be one of {list(LR_SCHEDULES)}", scalars["lr_schedule"])
        _require(0.0 <= scalars["lr_floor"] <= 1.0, "lr-floor", "must be in [0, 1]",
                 scalars["lr_floor"])
        _require(sizes.augmentation in AUGMENTATIONS, "augmentation",
                 f"must be one of {list(AUGMENTATIONS)}", sizes.augmentation)
        _require(privacy.noise_multiplier >= 0, "privacy.noise-multiplier", "must be >= 0",
                 privacy.noise_multiplier)
        _require(privacy.max_grad_norm > 0, "privacy.max-grad-norm", "must be > 0",
                 privacy.max_grad_norm)
        _require(0.0 < privacy.delta < 1.0, "privacy.delta", "must be in (0, 1)", privacy.delta)
        _require(privacy.accountant in ACCOUNTANTS, "privacy.accountant",
                 f"must be one of {list(ACCOUNTANTS)}", privacy.accountant)
        return cls(sizes=sizes, privacy=privacy, personalisation=personal, **scalars)

    def round_lr(self, server_round: int) -> float:
        """The local learning rate of round ``server_round`` (``lr`` under ``lr-schedule``)."""
        return round_lr(self.lr, self.lr_schedule, server_round, self.num_server_rounds,
                        self.lr_floor)
