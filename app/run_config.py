"""Typed, validated run configuration (``[tool.flwr.app.config]`` + overrides).

Every run setting the ServerApp and ClientApp use comes through
:meth:`RunConfig.from_mapping`, which checks types and ranges and fails with a
:class:`RunConfigError` naming the key, instead of a KeyError deep in a round.
Keys are spelled as in pyproject.toml: dashes (``local-steps``) and, for the
strategy plug-ins and the round policy, dotted groups (``strategy.aggregator``,
``round.deadline``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any

from clients.site_task import OPTIMIZERS, TaskSettings
from clients.tasks import TASKS
from strategies.compression import parse_spec
from strategies.errors import ConfigError

__all__ = ["RunConfig", "RunConfigError"]


class RunConfigError(ConfigError):
    """A run-config value is missing, of the wrong type or out of range."""


def _key(f: Field) -> str:
    return f.metadata.get("key", f.name.replace("_", "-"))


def _dotted(key: str, default: Any) -> Any:
    return field(default=default, metadata={"key": key})


@dataclass(frozen=True)
class RunConfig:
    """Settings of one federation (see pyproject.toml for the defaults)."""

    task: str = "pe-seg"
    num_server_rounds: int = 6
    local_steps: int = 200
    batch_size: int = 8
    optimizer: str = "adam"
    lr: float = 0.003
    momentum: float = 0.9
    proximal_mu: float = 0.0
    time_budget: float = 0.0
    image_size: int = 64
    slab_slices: int = 9
    num_labels: int = 1
    model_size: str = "small"
    volume_depth: int = 32
    data_root: str = ""
    tracking_uri: str = ""
    artifact_root: str = ""
    experiment: str = ""
    checkpoint_dir: str = ""
    resume: bool = False
    min_nodes: int = 2
    fraction_train: float = 1.0
    node_wait_timeout: float = 120.0
    round_timeout: float = 600.0
    seed: int = 0
    strategy_aggregator: str = _dotted("strategy.aggregator", "fedavg")
    strategy_schedule: str = _dotted("strategy.schedule", "fixed")
    strategy_selector: str = _dotted("strategy.selector", "uniform")
    strategy_server_momentum: float = _dotted("strategy.server-momentum", 0.0)
    strategy_tau_min: int = _dotted("strategy.tau-min", 1)
    strategy_tau_max: int = _dotted("strategy.tau-max", 0)
    strategy_loss_smoothing: float = _dotted("strategy.loss-smoothing", 0.5)
    selection_m: int = _dotted("selection.m", 0)
    selection_d: int = _dotted("selection.d", 0)
    selection_subset: int = _dotted("selection.subset", 32)
    selection_fairness_rounds: int = _dotted("selection.fairness-rounds", 0)
    strategy_codec: str = _dotted("strategy.codec", "none")
    strategy_error_feedback: bool = _dotted("strategy.error-feedback", True)
    round_deadline: float = _dotted("round.deadline", 0.0)
    round_quorum: int = _dotted("round.quorum", 0)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> RunConfig:
        """Build from Flower's run_config (keys such as ``local-steps``, ``round.quorum``).

        Unknown keys are rejected so that a typo cannot silently keep a default.
        """
        known = {_key(f): f for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise RunConfigError(f"unknown run-config keys {unknown}; known: {sorted(known)}")
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            f = known[key]
            kind = type(f.default)
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
                raise RunConfigError(
                    f"run-config '{key}' must be {kind.__name__}, got {value!r}")
            kwargs[f.name] = value
        config = cls(**kwargs)
        config.validate()
        return config

    def _fail(self, name: str, rule: str) -> None:
        key = _key(self.__dataclass_fields__[name])
        raise RunConfigError(f"run-config '{key}' {rule}, got {getattr(self, name)!r}")

    def validate(self) -> None:
        """Check ranges and cross-field rules."""
        if self.task not in TASKS:
            self._fail("task", f"must be one of {sorted(TASKS)}")
        if self.optimizer not in OPTIMIZERS:
            self._fail("optimizer", f"must be one of {OPTIMIZERS}")
        if self.model_size not in ("small", "full"):
            self._fail("model_size", "must be 'small' or 'full'")
        for name in ("num_server_rounds", "local_steps", "batch_size", "image_size",
                     "num_labels", "volume_depth",
                     "min_nodes", "node_wait_timeout", "round_timeout", "lr",
                     "strategy_tau_min"):
            if getattr(self, name) <= 0:
                self._fail(name, "must be > 0")
        for name in ("proximal_mu", "time_budget", "round_deadline", "round_quorum",
                     "strategy_tau_max", "selection_m", "selection_d", "selection_subset",
                     "selection_fairness_rounds"):
            if getattr(self, name) < 0:
                self._fail(name, "must be >= 0")
        for name in ("momentum", "strategy_server_momentum", "strategy_loss_smoothing"):
            if not 0.0 <= getattr(self, name) < 1.0:
                self._fail(name, "must be in [0, 1)")
        if not 0.0 < self.fraction_train <= 1.0:
            self._fail("fraction_train", "must be in (0, 1]")
        if self.slab_slices < 1 or self.slab_slices % 2 == 0:
            self._fail("slab_slices", "must be odd and >= 1")
        if self.image_size % 8:
            self._fail("image_size", "must be a multiple of 8")
        if self.selection_d and self.selection_d < self.selection_m:
            self._fail("selection_d", "must be 0 (adaptive) or >= selection.m")
        if self.strategy_tau_max and self.strategy_tau_max < self.strategy_tau_min:
            self._fail("strategy_tau_max", "must be 0 (no cap) or >= strategy.tau-min")
        if self.strategy_aggregator == "fednova" and self.optimizer != "sgd":
            self._fail("strategy_aggregator",
                       "'fednova' needs optimizer = \"sgd\": its solver norm ||a||_1 is "
                       "defined for SGD, heavy-ball momentum and proximal local solvers "
                       "(Wang et al. 2020), not Adam;")
        try:
            parse_spec(self.strategy_codec)
        except ValueError as exc:
            self._fail("strategy_codec", f"is not a valid codec spec ({exc})")
        if self.proximal_mu and self.optimizer != "sgd":
            self._fail("proximal_mu", "needs optimizer = \"sgd\"")
        if self.proximal_mu and self.momentum:
            self._fail("proximal_mu", "with momentum > 0 is not supported; set momentum = 0")
        if self.resume and not self.checkpoint_dir:
            self._fail("resume", "needs run-config 'checkpoint-dir'")
        for name in ("data_root", "artifact_root", "checkpoint_dir"):
            value = getattr(self, name)
            if value and not Path(value).is_absolute():
                self._fail(name, "must be an absolute path (Flower's daemons do not run in "
                                 "the project directory)")

    def task_settings(self) -> TaskSettings:
        """The task's sizes and sampling."""
        return TaskSettings(image_size=self.image_size, slab_slices=self.slab_slices,
                            batch_size=self.batch_size, num_labels=self.num_labels,
                            model_size=self.model_size, volume_depth=self.volume_depth)

    def as_params(self) -> dict[str, Any]:
        """Flat ``{key: value}`` with the run-config spelling, for MLflow params."""
        return {_key(f): getattr(self, f.name) for f in fields(self)}
