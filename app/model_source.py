"""Where a model comes from: a state-dict file or an MLflow model, checked against the task's network.

Two uses. ``initial-model`` in the run config starts a federation from a model
trained elsewhere (transfer learning: the book's emphysema classifier starts
from a model pre-trained centrally on NLST and fine-tuned on LTRC):
:func:`load_state_dict_from` reads the weights and checks every tensor's name
and shape against the freshly built network. ``make predict`` applies a model
the federation logged: :func:`load_logged_model` loads it with its task and
settings from the MLflow model's ``fedmed`` metadata, so no other file is needed.

A *source* is an MLflow model URI (``runs:/<run id>/best-model``,
``models:/<registered name>/<version>``, ``models:/<name>@<alias>``,
``models:/m-<model id>``; the tracking server is MLflow's current one, see
``MLFLOW_TRACKING_URI``), a local MLflow model folder (holding ``MLmodel``),
or a path to a state-dict file (``.pt`` / ``.pth``,
read with ``torch.load(weights_only=True)``: tensors only, never pickled code).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from clients.registry import task_class
from clients.training.site_task import TaskSettings
from strategies.errors import ConfigError

__all__ = ["ModelSourceError", "LoggedModel", "METADATA_KEY", "is_mlflow_uri",
           "load_state_dict_from", "load_logged_model"]

#: The key of the product's entry in an MLflow model's ``metadata``.
METADATA_KEY = "fedmed"
#: A URI scheme (``runs:/``, ``models:/``, ``mlflow-artifacts:/``, ``s3://``...), not a drive letter.
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")
#: Keys under which common training checkpoints nest their state dict.
_NESTED_KEYS = ("state_dict", "model_state_dict", "model")


class ModelSourceError(ConfigError):
    """A model source is missing, unreadable, or does not fit the task's network; names the source."""


@dataclass(frozen=True)
class LoggedModel:
    """A model the federation logged to MLflow, with what is needed to apply it.

    Attributes
    ----------
    model : nn.Module
        The network, in eval mode, on the CPU.
    task : str
        The task name (``pe-seg``, ``cxr-cls``, ``ct3d-cls``).
    settings : TaskSettings
        The task's sizes (image size, slab slices, labels...) the model was trained with.
    private : bool
        Whether the network was made DP-SGD-compatible (GroupNorm for BatchNorm).
    uri : str
        Where it was loaded from.
    """

    model: nn.Module
    task: str
    settings: TaskSettings
    private: bool
    uri: str


def is_mlflow_uri(source: str) -> bool:
    """True when ``source`` is a URI (``runs:/...``, ``models:/...``), False for a file path."""
    return bool(_URI.match(source))


def load_state_dict_from(source: str, template: nn.Module) -> dict[str, torch.Tensor]:
    """Read model weights from ``source`` and check them against ``template``.

    Parameters
    ----------
    source : str
        A state-dict file (``.pt`` / ``.pth``; a checkpoint nesting it under
        ``state_dict``, ``model_state_dict`` or ``model`` is accepted), an
        MLflow model URI or a local MLflow model folder (its ``state_dict()``).
    template : nn.Module
        The network the weights are for (the run's fresh model).

    Returns
    -------
    dict of str to torch.Tensor
        Every entry of ``template.state_dict()``, in its order, cast to its dtype.

    Raises
    ------
    ModelSourceError
        If the file is missing or unreadable, the URI does not load, a key is
        missing or unexpected, or a tensor's shape differs (the message names
        the source and the first mismatched tensor with both shapes).
    """
    mlflow_model = is_mlflow_uri(source) or (Path(source).expanduser() / "MLmodel").is_file()
    loaded = (_load_module(source, f"initial-model {source}").state_dict() if mlflow_model
              else _read_state_file(source))
    return _checked(loaded, template.state_dict(), source)


def load_logged_model(uri: str) -> LoggedModel:
    """Load an MLflow model logged by a federation, with its task and settings.

    Parameters
    ----------
    uri : str
        ``runs:/<run id>/best-model``, ``models:/<name>/<version>``, ``models:/m-<id>``,
        or a local MLflow model folder.

    Raises
    ------
    ModelSourceError
        If the URI does not load, or the model has no ``fedmed`` metadata (not
        logged by this product), or its task or settings are unknown.
    """
    import mlflow  # here: importing MLflow costs seconds, a state-dict file does not need it

    try:
        metadata = mlflow.models.get_model_info(uri).metadata or {}
    except Exception as exc:  # noqa: BLE001 - MLflow raises many types (missing run, store, format)
        raise ModelSourceError(f"{uri}: cannot load the MLflow model ({type(exc).__name__}: "
                               f"{_first_line(exc)})") from exc
    entry = metadata.get(METADATA_KEY)
    if not isinstance(entry, Mapping) or not isinstance(entry.get("task"), str):
        raise ModelSourceError(
            f"{uri}: the model has no '{METADATA_KEY}' metadata with its task (logged by another "
            "tool or an older version); log it with the ServerApp, or load the weights with "
            "initial-model into a run of the right task")
    task = entry["task"]
    try:
        task_class(task)
    except ConfigError as exc:
        raise ModelSourceError(f"{uri}: {exc}") from exc
    settings = _task_settings(entry.get("task-settings", {}), uri)
    model = _load_module(uri, uri)
    return LoggedModel(model.eval(), task, settings, bool(entry.get("private", False)), uri)


def _task_settings(values: Any, uri: str) -> TaskSettings:
    """TaskSettings from the metadata's ``task-settings`` (field names, ``image_size`` or ``image-size``)."""
    if not isinstance(values, Mapping):
        raise ModelSourceError(f"{uri}: metadata '{METADATA_KEY}.task-settings' must be a table, "
                               f"got {type(values).__name__}")
    defaults = TaskSettings()
    known = sorted(f.name for f in fields(TaskSettings))
    settings: dict[str, Any] = {}
    for key, value in values.items():
        name = str(key).replace("-", "_")
        if name not in known:
            raise ModelSourceError(f"{uri}: unknown task setting {key!r} in the model's metadata; "
                                   f"expected some of {known}")
        kind = type(getattr(defaults, name))
        try:
            settings[name] = kind(value)
        except (TypeError, ValueError):
            raise ModelSourceError(f"{uri}: task setting {key!r} = {value!r} in the model's "
                                   f"metadata is not a {kind.__name__}") from None
    return TaskSettings(**settings)


def _load_module(uri: str, what: str) -> nn.Module:
    """The MLflow PyTorch model at ``uri`` on the CPU; errors start with ``what``."""
    import mlflow  # here: importing MLflow costs seconds, a state-dict file does not need it

    try:
        model = mlflow.pytorch.load_model(uri, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - MLflow raises many types (missing run, store, format)
        raise ModelSourceError(f"{what}: cannot load the MLflow model "
                               f"({type(exc).__name__}: {_first_line(exc)})") from exc
    if not isinstance(model, nn.Module):
        raise ModelSourceError(f"{what}: loads as {type(model).__name__}, not a torch nn.Module")
    return model


def _read_state_file(source: str) -> Mapping[str, Any]:
    """The state dict in the file ``source`` (tensors only; a nesting checkpoint is unpacked)."""
    path = Path(source).expanduser()
    if not path.is_file():
        raise ModelSourceError(f"initial-model {path}: no such file (a state-dict .pt/.pth file or "
                               "an MLflow URI such as runs:/<run id>/best-model or models:/<name>/<version>)")
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for corrupt or pickled files
        raise ModelSourceError(f"initial-model {path}: not a readable state-dict file "
                               f"({type(exc).__name__}: {_first_line(exc)})") from exc
    if isinstance(loaded, Mapping):
        for key in _NESTED_KEYS:
            if isinstance(loaded.get(key), Mapping):
                loaded = loaded[key]
                break
    if not isinstance(loaded, Mapping) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise ModelSourceError(f"initial-model {path}: expected a state dict (names to tensors), "
                               f"got {type(loaded).__name__}")
    return loaded


def _checked(loaded: Mapping[str, Any], expected: Mapping[str, torch.Tensor],
             source: str) -> dict[str, torch.Tensor]:
    """``loaded`` in ``expected``'s order and dtypes; a key or shape that differs is an error."""
    missing = [key for key in expected if key not in loaded]
    if missing:
        raise ModelSourceError(f"initial-model {source}: {len(missing)} tensor(s) of this run's "
                               f"model missing, first {missing[0]!r} (of {_preview(missing)})")
    unexpected = [key for key in loaded if key not in expected]
    if unexpected:
        raise ModelSourceError(f"initial-model {source}: {len(unexpected)} tensor(s) this run's "
                               f"model does not have, first {unexpected[0]!r} (of {_preview(unexpected)})")
    state: dict[str, torch.Tensor] = {}
    for key, want in expected.items():
        have = loaded[key]
        if tuple(have.shape) != tuple(want.shape):
            raise ModelSourceError(f"initial-model {source}: {key!r}: {tuple(want.shape)} here, "
                                   f"{tuple(have.shape)} in {source}")
        state[key] = have.detach().to(dtype=want.dtype).clone()
    return state


def _preview(keys: list[str], limit: int = 5) -> str:
    """The first ``limit`` keys, comma-separated."""
    return ", ".join(keys[:limit]) + (", ..." if len(keys) > limit else "")


def _first_line(exc: BaseException) -> str:
    """The first line of an exception's message."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
