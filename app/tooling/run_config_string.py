"""The ``flwr run --run-config`` string of ``make simulate`` and ``make federate``, checked.

Absolute paths first (the daemons do not run in the project directory), then
the values of a preset TOML file, then ``KEY=VALUE`` overrides from the
command line; strings are quoted as TOML, numbers and booleans are not.
:func:`checked_run_config` reads the string back as ``flwr run`` does and checks
it as the ServerApp would, before any process starts.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import click
from flwr.common.config import parse_config_args

from strategies.wire.errors import ConfigError

__all__ = ["build_run_config", "checked_run_config"]


def _toml_value(value: str) -> str:
    """Quote a command-line value for ``flwr run --run-config`` unless it is a number/bool."""
    if re.fullmatch(r"-?\d+(\.\d*)?([eE]-?\d+)?|true|false", value) or value.startswith('"'):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml_literal(value: object) -> str:
    """A value read from a preset file, written back as TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return _toml_value(str(value))


def build_run_config(overrides: list[str], data_root: Path, tracking_uri: str,
                     artifact_root: Path, preset: Path | None = None,
                     base: dict[str, str] | None = None) -> str:
    """The ``--run-config`` string: absolute paths and ``base`` (the caller's defaults),
    then the preset file, then overrides."""
    values = {"data-root": str(data_root.resolve()), "tracking-uri": tracking_uri,
              "artifact-root": str(artifact_root.resolve()), **(base or {})}
    if preset is not None:
        with open(preset, "rb") as handle:
            values.update({k: _toml_literal(v) for k, v in tomllib.load(handle).items()})
    for item in overrides:
        if "=" not in item:
            raise SystemExit(f"run-config override must be key=value, got {item!r}")
        key, value = item.split("=", 1)
        values[key.strip()] = value.strip()
    return " ".join(f"{k}={_toml_value(v)}" for k, v in values.items())


def checked_run_config(run_config: str) -> dict[str, Any]:
    """The complete run config of ``run_config`` (a :func:`build_run_config` string).

    Parsed by Flower's own ``--run-config`` parser, completed with pyproject.toml's
    defaults and checked as the ServerApp checks it
    (:func:`app.engine.federation.full_run_config`: unknown keys, types, ranges,
    plug-in names and options, the task, the roster file).

    Raises
    ------
    ConfigError
        The first problem, in one line that names the key.
    """
    from app.engine.federation import full_run_config  # noqa: PLC0415 - imports torch

    try:
        values = parse_config_args([run_config])
    except click.ClickException as exc:
        raise ConfigError(f"run config {run_config!r}: {exc.message}") from None
    try:
        return full_run_config(values)
    except ConfigError as exc:
        raise ConfigError(" ".join(str(exc).split())) from None
