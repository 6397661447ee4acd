"""The models MLflow holds: a loadable ``nn.Module`` with the task it belongs to, and its
Model Registry entries.

A model is logged in MLflow's ``pickle`` serialization (``torch.save`` of the module
through cloudpickle), not MLflow's default ``pt2``: ``torch.export`` specialises the
batch dimension of an example of batch 1 to a constant, and its ``GraphModule`` refuses
``.eval()``, so the exported model could only score one image at a time. The project's
``models`` package travels with the model (``code_paths``), so
``mlflow.pytorch.load_model(uri)`` gives the plain module back (any batch size,
``.eval()``) in a process that has only MLflow, torch and MONAI; ``mlflow.pyfunc``
predicts on an ``(N, ...)`` float32 array. Loading a pickled model runs code from its
artifact: load only models of your own registry.

Every model carries ``metadata={"fedmed": {...}}`` (:func:`model_metadata`): the task,
its settings, whether the network was made DP-compatible, its preprocessing in one line
(the task's :meth:`~clients.training.site_task.SiteTask.preprocessing_text`) and the main
metric, so loading it needs no other file. The signature has a batch dimension of -1.
"""

from __future__ import annotations

import dataclasses
import logging
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

import models
from clients.registry import task_class
from clients.root_logging import root_logging_kept

__all__ = ["MODEL_REQUIREMENTS", "log_task_model", "model_metadata", "register_version"]


with root_logging_kept():  # mlflow.pytorch._lightning_autolog calls logging.basicConfig
    import mlflow.pytorch  # noqa: F401

#: Pinned requirements recorded with the model, so MLflow does not run its slow
#: (and network-hungry) requirement inference; cloudpickle unpickles the module.
MODEL_REQUIREMENTS = ["torch==2.13.0", "monai", "numpy", "cloudpickle"]


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
    return {"fedmed": {"task": task, "task-settings": values, "private": bool(private),
                       "preprocessing": task_class(task).preprocessing_text(settings),
                       "main-metric": main_metric}}


def log_task_model(model: nn.Module, name: str, input_example: np.ndarray,
                   metadata: dict[str, Any]) -> str:
    """Log ``model`` (moved to the CPU, in eval mode) in the active run; returns its URI.

    ``input_example`` is one input batch; the signature is inferred from two copies of
    it and the model's output, so its batch dimension is -1.
    """
    model = model.cpu().eval()
    batch = np.concatenate([input_example[:1]] * 2)
    with torch.no_grad():
        output = model(torch.from_numpy(batch)).numpy()
    flavour_log = logging.getLogger("mlflow.pytorch")
    level = flavour_log.level
    flavour_log.setLevel(logging.ERROR)  # its pickle warning, once per model: see the docstring
    try:
        info = mlflow.pytorch.log_model(
            model, name=name, input_example=input_example[:1],
            signature=infer_signature(batch, output), serialization_format="pickle",
            code_paths=[str(Path(models.__file__).parent)], pip_requirements=MODEL_REQUIREMENTS,
            metadata=metadata)
    finally:
        flavour_log.setLevel(level)
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
