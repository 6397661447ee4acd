"""The models MLflow holds: weights (safetensors) plus the task's metadata, never a pickle, and
their Model Registry entries.

A model is logged as an MLflow pyfunc in models-from-code form
(:mod:`app.tracking.task_pyfunc`): the weights are the artifact ``weights``
(``artifacts/model.safetensors``, :mod:`app.tracking.model_folder`), the network is
built from the product's code at load time. ``mlflow.pyfunc.load_model(uri)`` predicts
on an ``(N, ...)`` float32 array of any batch size; ``make predict``
(:func:`app.model_source.load_logged_model`) builds the network and loads the tensors
without running anything from the model's folder. The signature has a batch
dimension of -1. (MLflow's ``pytorch`` flavor saves a pickled module, and its ``pt2``
format, ``torch.export``, specialises the batch dimension to the example's.)

Every model carries ``metadata={"fedmed": {...}}`` (:func:`model_metadata`): the task,
its settings, whether the network was made DP-compatible, its preprocessing in one line
(the task's :meth:`~clients.training.site_task.SiteTask.preprocessing_text`), the main
metric, the weights' format and the product's version (and git commit when known), so
loading it needs no other file.
"""

from __future__ import annotations

import dataclasses
import subprocess
import tempfile
import tomllib
from logging import WARNING
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch
from flwr.supercore import log
from mlflow.exceptions import MlflowException
from mlflow.models import infer_signature
from torch import nn

from app.config.product_paths import PROJECT_ROOT
from app.tracking.model_folder import (METADATA_KEY, WEIGHTS_ARTIFACT, WEIGHTS_FILE,
                                       WEIGHTS_FORMAT, save_weights)
from clients.registry import task_class

__all__ = ["MODEL_REQUIREMENTS", "log_task_model", "model_metadata", "product_release",
           "register_version"]

#: Pinned requirements recorded with the model, so MLflow does not run its slow (and
#: network-hungry) requirement inference; the pyfunc also needs the product importable.
MODEL_REQUIREMENTS = ["torch==2.13.0", "monai", "numpy", "safetensors"]
#: The models-from-code file MLflow logs as the model's code (:mod:`app.tracking.task_pyfunc`).
_MODEL_CODE = Path(__file__).with_name("task_pyfunc.py")


def product_release(root: Path = PROJECT_ROOT) -> dict[str, str]:
    """The product's ``version`` (pyproject.toml) and ``commit`` (when ``root`` is a git checkout)."""
    release: dict[str, str] = {}
    try:
        release["version"] = str(tomllib.loads((root / "pyproject.toml").read_text())
                                 ["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        pass
    if (root / ".git").exists():
        try:
            done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=True,
                                  capture_output=True, text=True, timeout=10)
            release["commit"] = done.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return release


def model_metadata(task: str, settings: Any, private: bool, main_metric: str) -> dict[str, Any]:
    """The ``fedmed`` metadata of a logged model (the session's shared contract).

    Parameters
    ----------
    task : str
        The run config's ``task`` (a name of :mod:`clients.registry`).
    settings : TaskSettings
        The task's settings (a dataclass); every field is recorded.
    private : bool
        Whether the network was made DP-SGD-compatible (BatchNorm -> GroupNorm).
    main_metric : str
        The task's main validation metric (``dice``, ``auc``).
    """
    values = dataclasses.asdict(settings)
    return {METADATA_KEY: {"task": task, "task-settings": values, "private": bool(private),
                           "preprocessing": task_class(task).preprocessing_text(settings),
                           "main-metric": main_metric, "weights": WEIGHTS_FORMAT,
                           **product_release()}}


def log_task_model(model: nn.Module, name: str, input_example: np.ndarray,
                   metadata: dict[str, Any]) -> str:
    """Log ``model``'s weights (from the CPU, in eval mode) with ``metadata`` in the active run;
    returns its URI.

    ``input_example`` is one input batch; the signature is inferred from two copies of
    it and the model's output, so its batch dimension is -1.
    """
    model = model.cpu().eval()
    batch = np.concatenate([input_example[:1]] * 2)
    with torch.no_grad():
        output = model(torch.from_numpy(batch)).numpy()
    with tempfile.TemporaryDirectory(prefix="fedmed-weights-") as folder:
        weights = save_weights(model, Path(folder) / WEIGHTS_FILE)
        info = mlflow.pyfunc.log_model(
            name=name, python_model=str(_MODEL_CODE),
            artifacts={WEIGHTS_ARTIFACT: str(weights)}, model_config=metadata[METADATA_KEY],
            input_example=input_example[:1], signature=infer_signature(batch, output),
            pip_requirements=MODEL_REQUIREMENTS, metadata=metadata)
    return info.model_uri


def register_version(model_uri: str, name: str, tags: dict[str, str]) -> str:
    """A new version of registered model ``name`` for ``model_uri``; ``""`` if the registry fails.

    The registry is a convenience on top of the logged model (whose URI is in the
    run): a store without one, or a failure, is logged and does not fail the
    federation.
    """
    try:
        version = mlflow.register_model(model_uri, name, tags=tags)
    except MlflowException as exc:
        log(WARNING, "could not register %s as %s (%s)", model_uri, name,
            str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return ""
    return f"models:/{name}/{version.version}"
