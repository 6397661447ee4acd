"""Typed, validated run configuration (``[tool.flwr.app.config]`` + overrides).

Every run setting the ServerApp and ClientApp use comes through
:meth:`RunConfig.from_mapping`, which checks types and ranges and fails with a
:class:`RunConfigError` naming the key, instead of a KeyError deep in a round.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from clients.pe_seg_task import OPTIMIZERS

__all__ = ["RunConfig", "RunConfigError", "TASKS", "OPTIMIZERS"]

TASKS = ("pe-seg",)


class RunConfigError(ValueError):
    """A run-config value is missing, of the wrong type or out of range."""


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
    image_size: int = 64
    slab_slices: int = 9
    data_root: str = ""
    tracking_uri: str = ""
    artifact_root: str = ""
    experiment: str = ""
    min_nodes: int = 2
    fraction_train: float = 1.0
    node_wait_timeout: float = 120.0
    round_timeout: float = 600.0
    seed: int = 0

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> RunConfig:
        """Build from Flower's run_config (keys with dashes, e.g. ``local-steps``).

        Unknown keys are rejected so that a typo cannot silently keep a default.
        """
        known = {f.name.replace("_", "-"): f for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise RunConfigError(f"unknown run-config keys {unknown}; known: {sorted(known)}")
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            f = known[key]
            kind = type(cls.__dataclass_fields__[f.name].default)
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise RunConfigError(
                    f"run-config '{key}' must be {kind.__name__}, got {value!r}")
            kwargs[f.name] = value
        config = cls(**kwargs)
        config.validate()
        return config

    def validate(self) -> None:
        """Check ranges and cross-field rules."""
        if self.task not in TASKS:
            raise RunConfigError(f"task must be one of {TASKS}, got {self.task!r}")
        positive = ("num_server_rounds", "local_steps", "batch_size", "image_size",
                    "min_nodes", "node_wait_timeout", "round_timeout", "lr")
        for name in positive:
            if getattr(self, name) <= 0:
                raise RunConfigError(f"run-config '{name.replace('_', '-')}' must be > 0")
        if self.optimizer not in OPTIMIZERS:
            raise RunConfigError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if not 0.0 <= self.momentum < 1.0:
            raise RunConfigError(f"momentum must be in [0, 1), got {self.momentum}")
        if not 0.0 < self.fraction_train <= 1.0:
            raise RunConfigError(f"fraction-train must be in (0, 1], got {self.fraction_train}")
        if self.slab_slices < 1 or self.slab_slices % 2 == 0:
            raise RunConfigError(f"slab-slices must be odd and >= 1, got {self.slab_slices}")
        if self.image_size % 8:
            raise RunConfigError(f"image-size must be a multiple of 8, got {self.image_size}")
        for name in ("data_root", "artifact_root"):
            value = getattr(self, name)
            if value and not Path(value).is_absolute():
                raise RunConfigError(
                    f"run-config '{name.replace('_', '-')}' must be an absolute path, got "
                    f"{value!r}: Flower's daemons do not run in the project directory")

    def as_params(self) -> dict[str, Any]:
        """Flat ``{key: value}`` with the run-config spelling, for MLflow params."""
        return {k.replace("_", "-"): v for k, v in asdict(self).items()}
