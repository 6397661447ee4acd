"""Where a model comes from: a weights file or a logged model, checked against the task's network.

Two uses. ``initial-model`` in the run config starts a federation from a model
trained elsewhere (transfer learning: the book's emphysema classifier starts
from a model pre-trained centrally on NLST and fine-tuned on LTRC):
:func:`load_state_dict_from` reads the weights and checks every tensor's name
and shape against the freshly built network. ``make predict`` applies a model
the federation logged: :func:`load_logged_model` builds the network from the
product's code with the task and settings of the model's ``fedmed`` metadata and
loads its safetensors weights, so no other file is needed and nothing in the
model's folder is executed or unpickled (:mod:`app.tracking.model_folder`).

A *source* is a local model folder (holding ``MLmodel``; applied with no tracking
store at all), an MLflow model URI (``runs:/<run id>/best-model``,
``models:/<registered name>/<version>``, ``models:/<name>@<alias>``,
``models:/m-<model id>``; downloaded from MLflow's current tracking store, which
must exist, :mod:`app.tracking.model_store`), or, for ``initial-model``, a weights
file: ``.safetensors``, or a state dict ``.pt`` / ``.pth`` read with
``torch.load(weights_only=True)`` (tensors only, never pickled code).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from app.tracking.model_folder import (METADATA_KEY, ModelFolderError, fedmed_entry, load_weights,
                                       refuse_pickles, weights_path)
from app.tracking.model_store import ModelStoreError, is_mlflow_uri, model_folder
from clients.registry import task_class
from clients.training.site_task import TaskSettings
from strategies.wire.errors import ConfigError

__all__ = ["ModelSourceError", "LoggedModel", "METADATA_KEY", "is_mlflow_uri",
           "load_state_dict_from", "load_logged_model", "network_from"]

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
    run_id : str
        The MLflow run (the federation) that logged it; ``""`` when the model records none.
    pruning : str
        The pruning mode of a pruned federation's model (metadata ``pruning.mode``:
        ``unstructured`` | ``structured``); ``""`` for a dense one.
    """

    model: nn.Module
    task: str
    settings: TaskSettings
    private: bool
    uri: str
    run_id: str = ""
    pruning: str = ""


def load_state_dict_from(source: str, template: nn.Module) -> dict[str, torch.Tensor]:
    """Read model weights from ``source`` and check them against ``template``.

    Parameters
    ----------
    source : str
        A weights file (``.safetensors``; a state dict ``.pt`` / ``.pth``, or a
        checkpoint nesting it under ``state_dict``, ``model_state_dict`` or ``model``),
        an MLflow model URI or a local model folder the product logged.
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
    what = f"initial-model {source}"
    if is_mlflow_uri(source) or (Path(source).expanduser() / "MLmodel").is_file():
        loaded: Mapping[str, Any] = load_logged_model(source).model.state_dict()
    else:
        loaded = _read_state_file(source)
    return _checked(loaded, template.state_dict(), what)


def load_logged_model(source: str) -> LoggedModel:
    """Load a model a federation logged: the product's network with its weights, task and settings.

    Parameters
    ----------
    source : str
        A local model folder, or ``runs:/<run id>/best-model``, ``models:/<name>/<version>``,
        ``models:/m-<id>`` (downloaded from MLflow's current tracking store).

    Raises
    ------
    ModelSourceError
        If the source does not load (names the store it searched), its folder holds a
        pickle (names the file), or the model has no ``fedmed`` metadata (not logged by
        this product), or its task, settings or tensors do not fit.
    """
    with tempfile.TemporaryDirectory(prefix="fedmed-model-") as download:
        try:
            folder = model_folder(source, Path(download))
            refuse_pickles(folder, source)
            logged = _read_folder(folder, source)
        except (ModelFolderError, ModelStoreError) as exc:
            raise ModelSourceError(str(exc)) from exc
    return logged


def _read_folder(folder: Path, source: str) -> LoggedModel:
    """The model in the local ``folder`` (already checked for pickles)."""
    from mlflow.models import Model  # here: importing MLflow costs seconds

    try:
        mlmodel = Model.load(str(folder))
    except Exception as exc:  # noqa: BLE001 - YAML and MLflow raise many types
        raise ModelSourceError(f"{source}: MLmodel in {folder} is not readable "
                               f"({type(exc).__name__}: {_first_line(exc)})") from exc
    entry = fedmed_entry(mlmodel.metadata, source)
    model = network_from(entry, weights_path(folder, mlmodel.flavors, source), source)
    pruning = entry.get("pruning", {})
    return LoggedModel(model, entry["task"], _task_settings(entry.get("task-settings", {}), source),
                       bool(entry.get("private", False)), source, mlmodel.run_id or "",
                       str(pruning.get("mode", "")) if isinstance(pruning, dict) else "")


def network_from(entry: Mapping[str, Any], weights: Path, source: str) -> nn.Module:
    """The task's network of a ``fedmed`` metadata ``entry`` with the safetensors ``weights``.

    Built by the product's code (:meth:`SiteTask.model_for_run`, DP-compatible when the
    entry says ``private``); every tensor's name and shape is checked. In eval mode, on the CPU.

    Raises
    ------
    ModelSourceError
        If the task or a setting is unknown, or the tensors do not fit the network.
    """
    entry = fedmed_entry({METADATA_KEY: entry}, source)
    try:
        task = task_class(entry["task"])
    except ConfigError as exc:
        raise ModelSourceError(f"{source}: {exc}") from exc
    settings = _task_settings(entry.get("task-settings", {}), source)
    model = task.model_for_run(settings, private=bool(entry.get("private", False)))
    try:
        tensors = load_weights(weights, source)
    except ModelFolderError as exc:
        raise ModelSourceError(str(exc)) from exc
    model.load_state_dict(_checked(tensors, model.state_dict(), source))
    return model.eval()


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


def _read_state_file(source: str) -> Mapping[str, Any]:
    """The state dict in the file ``source`` (tensors only; a nesting checkpoint is unpacked)."""
    path = Path(source).expanduser()
    if not path.is_file():
        raise ModelSourceError(f"initial-model {path}: no such file (a .safetensors or state-dict "
                               ".pt/.pth file, a model folder, or an MLflow URI such as "
                               "runs:/<run id>/best-model or models:/<name>/<version>)")
    if path.suffix == ".safetensors":
        try:
            return load_weights(path, f"initial-model {path}")
        except ModelFolderError as exc:
            raise ModelSourceError(str(exc)) from exc
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
             what: str) -> dict[str, torch.Tensor]:
    """``loaded`` in ``expected``'s order and dtypes; a key or shape that differs is an error
    (its message starts with ``what``, the source)."""
    missing = [key for key in expected if key not in loaded]
    if missing:
        raise ModelSourceError(f"{what}: {len(missing)} tensor(s) of the task's network "
                               f"missing, first {missing[0]!r} (of {_preview(missing)})")
    unexpected = [key for key in loaded if key not in expected]
    if unexpected:
        raise ModelSourceError(f"{what}: {len(unexpected)} tensor(s) the task's network does not "
                               f"have, first {unexpected[0]!r} (of {_preview(unexpected)})")
    state: dict[str, torch.Tensor] = {}
    for key, want in expected.items():
        have = loaded[key]
        if tuple(have.shape) != tuple(want.shape):
            raise ModelSourceError(f"{what}: {key!r}: {tuple(want.shape)} here, "
                                   f"{tuple(have.shape)} in the source")
        state[key] = have.detach().to(dtype=want.dtype).clone()
    return state


def _preview(keys: list[str], limit: int = 5) -> str:
    """The first ``limit`` keys, comma-separated."""
    return ", ".join(keys[:limit]) + (", ..." if len(keys) > limit else "")


def _first_line(exc: BaseException) -> str:
    """The first line of an exception's message."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
