"""Typed, validated run configuration (``[tool.flwr.app.config]`` + overrides).

Every run setting the ServerApp uses comes through :meth:`RunConfig.from_mapping`,
which checks types and ranges and fails with a :class:`RunConfigError` naming the key,
instead of a KeyError deep in a round. Keys are spelled as in pyproject.toml: dashes
(``local-steps``) and, for the strategy plug-ins and the round policy, dotted groups
(``strategy.aggregator``, ``round.deadline``). The flat keys' types, defaults and
ranges are the one table :data:`strategies.wire.run_keys.RUN_KEYS`, which the site's view
(:class:`clients.site.instruction.SiteRunSettings`) reads too; this module adds the
rules between keys.

The plug-ins' own options live in their sections (``fednova.min-steps-fraction``,
``adacomm.tau-min``, ``selection.m``, ...): each plug-in declares and validates
them (:mod:`strategies.wire.plugin_options`), so this module names no plug-in; it
hands the sections and the :class:`~strategies.wire.plugin_options.RunSettings`
plug-ins read to :mod:`strategies.plugins.registries`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any

from clients.training.task_settings import SITE_CHOICES, TaskSettings
from clients.registry import TASKS
from strategies.compression import check_warmup, parse_spec
from strategies.downlink import check_downlink_codec
from strategies.wire.errors import ConfigError
from strategies.wire.plugin_options import PluginOptions
from strategies.wire.personalisation_options import PersonalisationOptions, split_personalisation
from strategies.plugins.personalisation.rules import PersonalisationRun, check_personalisation
from strategies.plugins.run_settings import RunSettings
from strategies.plugins.registries import (
    PLUGIN_REGISTRIES,
    check,
    default_sections,
    parse_sections,
)
from strategies.robust import SCORE_RULES
from strategies.wire.run_keys import check as check_key
from strategies.wire.run_keys import run_key, typed
from strategies.wire.vertical_options import VerticalOptions, split_vertical

__all__ = ["CARRIED_KEYS", "RunConfig", "RunConfigError"]


class RunConfigError(ConfigError):
    """A run-config value is missing, of the wrong type or out of range."""


#: Run-config keys that carry no setting of the federation: the coordinator's
#: signature of the app bundle, which the site runner checks
#: (:mod:`app.site_runtime.app_approval`). Accepted (a string), then left out, so they
#: are neither MLflow params nor part of a checkpoint's resume check.
CARRIED_KEYS = ("app-signature",)


def _key(f: Field) -> str:
    return f.metadata["key"]


def _scalar_fields(config: Any) -> list[Field]:
    """The fields that are one run-config key each (not the task's, not the plug-ins')."""
    return [f for f in fields(config) if not f.metadata.get("group")]


def _task_fields() -> dict[str, Field]:
    """Run-config key -> the :class:`TaskSettings` field it sets (``image-size``, ...)."""
    return {_key(f): f for f in fields(TaskSettings) if "key" in f.metadata}


#: The names of the keys whose choices are a registry (``RunKey.registry``): the site
#: side's, the task's and the best-round score's (the plug-ins' are checked by their
#: registries, :func:`strategies.plugins.registries.check`).
_CHOICES: dict[str, Collection[str]] = {**SITE_CHOICES, "task": TASKS,
                                        "best-round.aggregate": SCORE_RULES}


@dataclass(frozen=True)
class RunConfig:
    """Settings of one federation: the server's view of the run-config table.

    Every flat key of :data:`strategies.wire.run_keys.RUN_KEYS` is a field (its default the
    table's, pyproject.toml's) but the carried ones (:data:`CARRIED_KEYS`).

    The task's sizes (``image-size``, ``slab-slices``, ``batch-size``, ``num-labels``,
    ``model-size``, ``volume-depth``) and ``augmentation`` are :class:`TaskSettings` fields, held in
    ``task_sizes``; the plug-ins' sections are in ``plugin_options``.
    """

    task: str = run_key("task")
    num_server_rounds: int = run_key("num-server-rounds")
    local_steps: int = run_key("local-steps")
    optimizer: str = run_key("optimizer")
    lr: float = run_key("lr")
    lr_schedule: str = run_key("lr-schedule")
    lr_floor: float = run_key("lr-floor")
    momentum: float = run_key("momentum")
    proximal_mu: float = run_key("proximal-mu")
    time_budget: float = run_key("time-budget")
    data_root: str = run_key("data-root")
    tracking_uri: str = run_key("tracking-uri")
    artifact_root: str = run_key("artifact-root")
    experiment: str = run_key("experiment")
    checkpoint_dir: str = run_key("checkpoint-dir")
    resume: bool = run_key("resume")
    tracking_end_wait_s: float = run_key("tracking.end-wait-s")
    #: Simulation only (:mod:`app.config.site_config`): the sites' policy file.
    site_policy: str = run_key("site-policy")
    min_nodes: int = run_key("min-nodes")
    fraction_train: float = run_key("fraction-train")
    fraction_evaluate: float = run_key("fraction-evaluate")
    node_wait_timeout: float = run_key("node-wait-timeout")
    round_timeout: float = run_key("round-timeout")
    seed: int = run_key("seed")
    strategy_aggregator: str = run_key("strategy.aggregator")
    strategy_schedule: str = run_key("strategy.schedule")
    strategy_selector: str = run_key("strategy.selector")
    strategy_defence: str = run_key("strategy.defence")
    strategy_codec: str = run_key("strategy.codec")
    strategy_codec_warmup_rounds: int = run_key("strategy.codec-warmup-rounds")
    strategy_codec_rate: str = run_key("strategy.codec-rate")
    strategy_downlink_codec: str = run_key("strategy.downlink-codec")
    strategy_error_feedback: bool = run_key("strategy.error-feedback")
    strategy_secure_aggregation: str = run_key("strategy.secure-aggregation")
    strategy_pruning: str = run_key("strategy.pruning")
    strategy_server_opt: str = run_key("strategy.server-opt")
    strategy_control_variates: str = run_key("strategy.control-variates")
    round_deadline: float = run_key("round.deadline")
    round_quorum: int = run_key("round.quorum")
    round_max_held_mb: float = run_key("round.max-held-mb")
    federation_roster: str = run_key("federation.roster")
    federation_max_size_ratio: float = run_key("federation.max-size-ratio")
    #: Sites a model needs to be complete (strategies/rounds/site_coverage.py).
    federation_min_contributing_sites: int = run_key("federation.min-contributing-sites")
    federation_kind: str = run_key("federation.kind")
    dp_noise_multiplier: float = run_key("privacy.noise-multiplier")
    dp_max_grad_norm: float = run_key("privacy.max-grad-norm")
    dp_delta: float = run_key("privacy.delta")
    dp_accountant: str = run_key("privacy.accountant")
    early_stopping_patience: int = run_key("early-stopping.patience")
    early_stopping_min_delta: float = run_key("early-stopping.min-delta")
    best_round_aggregate: str = run_key("best-round.aggregate")
    initial_model: str = run_key("initial-model")
    #: The selected model on every site's test split at the end.
    final_evaluation: bool = run_key("final-evaluation")
    cross_site_finetune_steps: int = run_key("cross-site.finetune-steps")
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
            typed(key, values.get(key, ""), RunConfigError)
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
            (kwargs if key in known else sizes)[f.name] = typed(key, values[key], RunConfigError)
        config = cls(task_sizes=TaskSettings(**sizes), **kwargs)
        config.validate()
        return config

    def _fail(self, name: str, rule: str) -> None:
        key = _key(self.__dataclass_fields__[name])
        raise RunConfigError(f"run-config '{key}' {rule}, got {getattr(self, name)!r}")

    def validate(self) -> None:
        """Check each key's range or choices (:data:`strategies.wire.run_keys.RUN_KEYS`), then the
        rules between keys."""
        for f in _scalar_fields(self):
            check_key(_key(f), getattr(self, f.name), _CHOICES.get(_key(f), ()), RunConfigError)
        for key, f in _task_fields().items():
            check_key(key, getattr(self.task_sizes, f.name), _CHOICES.get(key, ()),
                      RunConfigError)
        if self.task_sizes.augmentation != "none" and not TASKS.get(self.task).augmentable:
            raise RunConfigError(
                f"run-config 'augmentation' must be 'none' for task {self.task!r} (only the "
                f"image classifiers {[t for t in TASKS if TASKS.get(t).augmentable]} augment), "
                f"got {self.task_sizes.augmentation!r}")
        if self.lr_schedule != "constant" and self.proximal_mu:
            self._fail("lr_schedule", "must be 'constant' with proximal-mu > 0 (the server's "
                       "a-norm of FedProx's steps assumes one lr)")
        if self.early_stopping_patience and not self.fraction_evaluate:
            self._fail("early_stopping_patience", "needs fraction-evaluate > 0 (it watches "
                       "the validation metric)")
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
