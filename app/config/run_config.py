"""Typed, validated run configuration (``[tool.flwr.app.config]`` + overrides).

Every run setting the ServerApp and ClientApp use comes through
:meth:`RunConfig.from_mapping`, which checks types and ranges and fails with a
:class:`RunConfigError` naming the key, instead of a KeyError deep in a round.
Keys are spelled as in pyproject.toml: dashes (``local-steps``) and, for the
strategy plug-ins and the round policy, dotted groups (``strategy.aggregator``,
``round.deadline``).

The plug-ins' own options live in their sections (``fednova.min-steps-fraction``,
``adacomm.tau-min``, ``selection.m``, ...): each plug-in declares and validates
them (:mod:`strategies.plugins.options`), so this module names no plug-in; it
hands the sections and the :class:`~strategies.plugins.options.RunSettings`
plug-ins read to :mod:`strategies.plugins.registries`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any

from clients.training.augmentation_levels import AUGMENTATIONS
from clients.training.dp_accountants import ACCOUNTANTS, DEFAULT_ACCOUNTANT
from clients.training.lr_schedule import LR_SCHEDULES
from clients.training.task_settings import OPTIMIZERS, TaskSettings
from clients.registry import TASKS
from strategies.compression import check_warmup, parse_spec
from strategies.downlink import check_downlink_codec
from strategies.errors import ConfigError
from strategies.plugins.options import PluginOptions, typed_value
from strategies.plugins.personalisation.options import (PersonalisationOptions,
                                                        split_personalisation)
from strategies.plugins.personalisation.rules import PersonalisationRun, check_personalisation
from strategies.plugins.run_settings import RunSettings
from strategies.plugins.registries import (
    PLUGIN_REGISTRIES,
    check,
    default_sections,
    parse_sections,
)
from strategies.rounds.site_metric_score import SCORE_RULES
from strategies.vertical.options import FEDERATION_KINDS, VerticalOptions, split_vertical

__all__ = ["CARRIED_KEYS", "RunConfig", "RunConfigError"]


class RunConfigError(ConfigError):
    """A run-config value is missing, of the wrong type or out of range."""


#: Run-config keys that carry no setting of the federation: the coordinator's
#: signature of the app bundle, which the site runner checks
#: (:mod:`app.site_runtime.app_approval`). Accepted (a string), then left out, so they
#: are neither MLflow params nor part of a checkpoint's resume check.
CARRIED_KEYS = ("app-signature",)


def _key(f: Field) -> str:
    return f.metadata.get("key", f.name.replace("_", "-"))


def _dotted(key: str, default: Any) -> Any:
    return field(default=default, metadata={"key": key})


def _scalar_fields(config: Any) -> list[Field]:
    """The fields that are one run-config key each (not the task's, not the plug-ins')."""
    return [f for f in fields(config) if not f.metadata.get("group")]


# TaskSettings fields that are run-config keys (positive_fraction stays the task's).
_TASK_KEYS = ("image_size", "slab_slices", "batch_size", "num_labels", "model_size",
              "volume_depth", "augmentation")


def _task_fields() -> dict[str, Field]:
    """Run-config key -> the :class:`TaskSettings` field it sets (``image-size``, ...)."""
    return {f.name.replace("_", "-"): f for f in fields(TaskSettings) if f.name in _TASK_KEYS}


def _typed(key: str, value: Any, f: Field) -> Any:
    """``value`` checked against the type of ``f``'s default (an int widens to a float)."""
    try:
        return typed_value(value, type(f.default))
    except TypeError:
        raise RunConfigError(f"run-config '{key}' must be {type(f.default).__name__}, "
                             f"got {value!r}") from None


@dataclass(frozen=True)
class RunConfig:
    """Settings of one federation (see pyproject.toml for the defaults).

    The task's sizes (``image-size``, ``slab-slices``, ``batch-size``, ``num-labels``,
    ``model-size``, ``volume-depth``) and ``augmentation`` are :class:`TaskSettings` fields, held in
    ``task_sizes``; the plug-ins' sections are in ``plugin_options``.
    """

    task: str = "pe-seg"
    num_server_rounds: int = 6
    local_steps: int = 200
    optimizer: str = "adam"
    lr: float = 0.003
    lr_schedule: str = "constant"
    lr_floor: float = 0.0
    momentum: float = 0.9
    proximal_mu: float = 0.0
    time_budget: float = 0.0
    data_root: str = ""
    tracking_uri: str = ""
    artifact_root: str = ""
    experiment: str = ""
    checkpoint_dir: str = ""
    resume: bool = False
    tracking_end_wait_s: float = _dotted("tracking.end-wait-s", 60.0)
    site_policy: str = ""  # simulation only (app.config.site_config): the sites' policy file
    min_nodes: int = 2
    fraction_train: float = 1.0
    fraction_evaluate: float = 1.0
    node_wait_timeout: float = 120.0
    round_timeout: float = 600.0
    seed: int = 0
    strategy_aggregator: str = _dotted("strategy.aggregator", "fedavg")
    strategy_schedule: str = _dotted("strategy.schedule", "fixed")
    strategy_selector: str = _dotted("strategy.selector", "uniform")
    strategy_defence: str = _dotted("strategy.defence", "norm-bound")
    strategy_codec: str = _dotted("strategy.codec", "none")
    strategy_codec_warmup_rounds: int = _dotted("strategy.codec-warmup-rounds", 0)
    strategy_codec_rate: str = _dotted("strategy.codec-rate", "fixed")
    strategy_downlink_codec: str = _dotted("strategy.downlink-codec", "none")
    strategy_error_feedback: bool = _dotted("strategy.error-feedback", True)
    strategy_secure_aggregation: str = _dotted("strategy.secure-aggregation", "none")
    strategy_pruning: str = _dotted("strategy.pruning", "none")
    strategy_server_opt: str = _dotted("strategy.server-opt", "sgd")
    strategy_control_variates: str = _dotted("strategy.control-variates", "none")
    round_deadline: float = _dotted("round.deadline", 0.0)
    round_quorum: int = _dotted("round.quorum", 0)
    round_max_held_mb: float = _dotted("round.max-held-mb", 4096.0)
    federation_roster: str = _dotted("federation.roster", "")
    federation_max_size_ratio: float = _dotted("federation.max-size-ratio", 3.0)
    federation_kind: str = _dotted("federation.kind", "horizontal")
    dp_noise_multiplier: float = _dotted("privacy.noise-multiplier", 0.0)
    dp_max_grad_norm: float = _dotted("privacy.max-grad-norm", 1.0)
    dp_delta: float = _dotted("privacy.delta", 1e-5)
    dp_accountant: str = _dotted("privacy.accountant", DEFAULT_ACCOUNTANT)
    early_stopping_patience: int = _dotted("early-stopping.patience", 0)
    early_stopping_min_delta: float = _dotted("early-stopping.min-delta", 0.0)
    best_round_aggregate: str = _dotted("best-round.aggregate", "auto")
    initial_model: str = ""
    final_evaluation: bool = True  # the selected model on every site's test split at the end
    cross_site_finetune_steps: int = _dotted("cross-site.finetune-steps", 2)
    task_sizes: TaskSettings = field(default_factory=TaskSettings, metadata={"group": "task"})
    plugin_options: dict[str, PluginOptions] = field(default_factory=default_sections,
                                                     metadata={"group": "plug-ins"})
    personalisation_options: PersonalisationOptions = field(
        default_factory=PersonalisationOptions, metadata={"group": "personalisation"})
    vertical_options: VerticalOptions = field(default_factory=VerticalOptions,
                                              metadata={"group": "vertical"})

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> RunConfig:
        """Build from Flower's run_config (keys such as ``local-steps``, ``round.quorum``).

        Unknown keys are rejected so that a typo cannot silently keep a default;
        the plug-in sections are validated by the plug-ins' options
        (:func:`strategies.plugins.registries.parse_sections`).
        """
        for key in CARRIED_KEYS:
            if not isinstance(values.get(key, ""), str):
                raise RunConfigError(f"run-config '{key}' must be str, got {values[key]!r}")
        personal, values = split_personalisation(values)
        vertical, values = split_vertical(values)
        sections, rest = parse_sections({k: v for k, v in values.items()
                                         if k not in CARRIED_KEYS})
        known, task = {_key(f): f for f in _scalar_fields(cls)}, _task_fields()
        unknown = sorted(set(rest) - set(known) - set(task))
        if unknown:
            raise RunConfigError(f"unknown run-config keys {unknown}; known: "
                                 f"{sorted([*known, *task])} and the plug-in sections "
                                 f"{sorted(sections)}")
        kwargs: dict[str, Any] = {"plugin_options": sections,
                                  "personalisation_options": personal,
                                  "vertical_options": vertical}
        sizes: dict[str, Any] = {}
        for key in rest:
            f = known.get(key) or task[key]
            (kwargs if key in known else sizes)[f.name] = _typed(key, values[key], f)
        config = cls(task_sizes=TaskSettings(**sizes), **kwargs)
        config.validate()
        return config

    def _value(self, name: str) -> Any:
        return getattr(self.task_sizes if name in _TASK_KEYS else self, name)

    def _fail(self, name: str, rule: str) -> None:
        key = name.replace("_", "-") if name in _TASK_KEYS else _key(
            self.__dataclass_fields__[name])
        raise RunConfigError(f"run-config '{key}' {rule}, got {self._value(name)!r}")

    def validate(self) -> None:
        """Check ranges and cross-field rules."""
        if self.task not in TASKS:
            self._fail("task", f"must be one of {sorted(TASKS)}")
        if self.federation_kind not in FEDERATION_KINDS:
            self._fail("federation_kind", f"must be one of {list(FEDERATION_KINDS)}")
        if self.optimizer not in OPTIMIZERS:
            self._fail("optimizer", f"must be one of {list(OPTIMIZERS)}")
        if self.task_sizes.model_size not in ("small", "full"):
            self._fail("model_size", "must be 'small' or 'full'")
        if self.task_sizes.augmentation not in AUGMENTATIONS:
            self._fail("augmentation", f"must be one of {list(AUGMENTATIONS)}")
        if self.task_sizes.augmentation != "none" and not TASKS.get(self.task).augmentable:
            self._fail("augmentation", f"must be 'none' for task {self.task!r} (only the image "
                       f"classifiers {[t for t in TASKS if TASKS.get(t).augmentable]} augment)")
        if self.lr_schedule not in LR_SCHEDULES:
            self._fail("lr_schedule", f"must be one of {list(LR_SCHEDULES)}")
        if not 0.0 <= self.lr_floor <= 1.0:
            self._fail("lr_floor", "must be in [0, 1] (a fraction of lr)")
        if self.lr_schedule != "constant" and self.proximal_mu:
            self._fail("lr_schedule", "must be 'constant' with proximal-mu > 0 (the server's "
                       "a-norm of FedProx's steps assumes one lr)")
        for name in ("num_server_rounds", "local_steps", "batch_size", "image_size",
                     "num_labels", "volume_depth", "round_max_held_mb",
                     "min_nodes", "node_wait_timeout", "round_timeout", "lr"):
            if self._value(name) <= 0:
                self._fail(name, "must be > 0")
        for name in ("proximal_mu", "time_budget", "round_deadline", "round_quorum"):
            if getattr(self, name) < 0:
                self._fail(name, "must be >= 0")
        if self.tracking_end_wait_s < 0:
            self._fail("tracking_end_wait_s", "must be >= 0 (0 = one try, no wait)")
        if self.federation_max_size_ratio and self.federation_max_size_ratio < 1:
            self._fail("federation_max_size_ratio", "must be 0 (off) or >= 1")
        if self.dp_noise_multiplier < 0:
            self._fail("dp_noise_multiplier", "must be >= 0 (0 = no DP-SGD)")
        if self.dp_max_grad_norm <= 0:
            self._fail("dp_max_grad_norm", "must be > 0")
        if not 0.0 < self.dp_delta < 1.0:
            self._fail("dp_delta", "must be in (0, 1)")
        if self.dp_accountant not in ACCOUNTANTS:
            self._fail("dp_accountant", f"must be one of {list(ACCOUNTANTS)}")
        if not 0.0 <= self.momentum < 1.0:
            self._fail("momentum", "must be in [0, 1)")
        if not 0.0 < self.fraction_train <= 1.0:
            self._fail("fraction_train", "must be in (0, 1]")
        if not 0.0 <= self.fraction_evaluate <= 1.0:
            self._fail("fraction_evaluate", "must be in [0, 1]")
        if self.early_stopping_patience < 0 or self.early_stopping_min_delta < 0:
            self._fail("early_stopping_patience" if self.early_stopping_patience < 0
                       else "early_stopping_min_delta", "must be >= 0")
        if self.best_round_aggregate not in SCORE_RULES:
            self._fail("best_round_aggregate", f"must be one of {list(SCORE_RULES)}")
        if self.early_stopping_patience and not self.fraction_evaluate:
            self._fail("early_stopping_patience", "needs fraction-evaluate > 0 (it watches "
                       "the validation metric)")
        if self.task_sizes.slab_slices < 1 or self.task_sizes.slab_slices % 2 == 0:
            self._fail("slab_slices", "must be odd and >= 1")
        if self.task_sizes.image_size % 8:
            self._fail("image_size", "must be a multiple of 8")
        try:
            parse_spec(self.strategy_codec)
        except ValueError as exc:
            self._fail("strategy_codec", f"is not a valid codec spec ({exc})")
        try:
            check_warmup(self.strategy_codec, self.strategy_codec_warmup_rounds)
        except ValueError as exc:
            self._fail("strategy_codec_warmup_rounds", f"is not valid ({exc})")
        for registry in PLUGIN_REGISTRIES:
            check(registry, self.plugin_choice(registry.key), self.plugin_options,
                  self.run_settings())
        try:
            check_downlink_codec(self.strategy_downlink_codec)
        except ValueError as exc:
            self._fail("strategy_downlink_codec", f"is not a valid downlink codec ({exc})")
        if self.proximal_mu and self.optimizer != "sgd":
            self._fail("proximal_mu", "needs optimizer = \"sgd\"")
        if self.proximal_mu and self.dp_noise_multiplier:
            self._fail("proximal_mu", "with DP-SGD (privacy.noise-multiplier > 0) is not supported")
        if self.proximal_mu and self.momentum:
            self._fail("proximal_mu", "with momentum > 0 is not supported; set momentum = 0")
        if self.cross_site_finetune_steps < 0:
            self._fail("cross_site_finetune_steps", "must be >= 0 (0 = only the global model)")
        check_personalisation(self.personalisation_options,
                              PersonalisationRun(self.local_steps, self.optimizer, self.momentum,
                                                 self.proximal_mu, self.strategy_aggregator,
                                                 self.strategy_schedule, self.dp_noise_multiplier))
        if self.resume and not self.checkpoint_dir:
            self._fail("resume", "needs run-config 'checkpoint-dir'")
        for name in ("data_root", "artifact_root", "checkpoint_dir", "federation_roster",
                     "site_policy"):
            value = getattr(self, name)
            if value and not Path(value).is_absolute():
                self._fail(name, "must be an absolute path (Flower's daemons do not run in "
                                 "the project directory)")

    @property
    def personalisation(self) -> str:
        """The run's ``personalisation.method``."""
        return self.personalisation_options.method

    def task_settings(self) -> TaskSettings:
        """The task's sizes and sampling."""
        return self.task_sizes

    def plugin_choice(self, choice_key: str) -> str:
        """The plug-in chosen by ``choice_key`` (``strategy.aggregator`` -> ``"fedavg"``)."""
        return next(getattr(self, f.name) for f in _scalar_fields(self)
                    if _key(f) == choice_key)

    def run_settings(self) -> RunSettings:
        """What the plug-ins read from the rest of the run config."""
        return RunSettings(local_steps=self.local_steps, num_rounds=self.num_server_rounds,
                           fraction_train=self.fraction_train, min_nodes=self.min_nodes,
                           seed=self.seed, optimizer=self.optimizer, codec=self.strategy_codec,
                           codec_warmup_rounds=self.strategy_codec_warmup_rounds,
                           aggregator=self.strategy_aggregator, defence=self.strategy_defence,
                           codec_rate=self.strategy_codec_rate,
                           secure_aggregation=self.strategy_secure_aggregation,
                           personalisation=self.personalisation,
                           privacy=self.dp_noise_multiplier > 0,
                           pruning=self.strategy_pruning, server_opt=self.strategy_server_opt)

    def as_params(self) -> dict[str, Any]:
        """Flat ``{key: value}`` with the run-config spelling, for MLflow params."""
        params = {_key(f): getattr(self, f.name) for f in _scalar_fields(self)}
        params.update({key: getattr(self.task_sizes, f.name)
                       for key, f in _task_fields().items()})
        for options in self.plugin_options.values():
            params.update(options.as_params())
        params.update(self.personalisation_options.as_params())
        params.update(self.vertical_options.as_params())
        return params
