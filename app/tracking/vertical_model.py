"""A vertical federation's model in MLflow: the coordinator's arrays plus metadata, registered.

A vertical federation has no global model of the task's network: what the coordinator
holds is pvFed's **global encoder** (``global-encoder.*``, one vector per aligned patient)
or split learning's **coordinator part** (``middle/*``) with the sites' part it hands out
(``part/*``). :func:`log_vertical_model` logs those arrays as an MLflow logged model of the
federation's run: ``model.safetensors`` (weights only, never a pickle; the same format
as the horizontal models, :mod:`app.tracking.model_folder`) and ``fedmed.json``, the
metadata (:func:`vertical_metadata`: task, flow, rounds, sites, the arrays' shapes, the
task's settings, the product's release); and registers it as a new version of
``<experiment>-final`` with the horizontal registry's code
(:func:`app.tracking.model_logging.register_version`), its tags naming the run, the flow,
the rounds and the sites.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
from mlflow import MlflowClient
from safetensors.numpy import save_file

from app.tracking.model_folder import METADATA_KEY, WEIGHTS_FILE, WEIGHTS_FORMAT
from app.tracking.model_logging import product_release, register_version

__all__ = ["METADATA_FILE", "VerticalModel", "log_vertical_model", "vertical_metadata"]

#: The metadata file beside the weights in the logged model's artifacts.
METADATA_FILE = "fedmed.json"


@dataclasses.dataclass(frozen=True)
class VerticalModel:
    """The logged model's URI (``models:/<model id>``) and its registry version (``""``: none)."""

    uri: str
    version: str


def vertical_metadata(task: str, method: str, rounds: int, sites: Sequence[str],
                      arrays: Mapping[str, np.ndarray], settings: Any,
                      intersection: int = 0) -> dict[str, Any]:
    """The ``fedmed`` metadata of a vertical federation's model.

    Parameters
    ----------
    task, method : str
        The run config's ``task`` and ``vertical.method`` (the flow).
    rounds : int
        The rounds the model was trained for.
    sites : sequence of str
        The departments / hospitals of the federation.
    arrays : mapping
        The model's arrays; their shapes are the model's input sizes (pvFed's patients x
        hidden embedding, split learning's layers).
    settings : dataclass
        The task's settings (image size, model size ...).
    intersection : int
        The patients every site shares (pvFed's PSI; 0 without one).
    """
    return {METADATA_KEY: {
        "task": task, "flow": method, "rounds": int(rounds), "sites": list(sites),
        "input-sizes": {name: list(np.shape(value)) for name, value in arrays.items()},
        "task-settings": dataclasses.asdict(settings), "intersection": int(intersection),
        "weights": WEIGHTS_FORMAT, **product_release()}}


def log_vertical_model(run_id: str, experiment: str, arrays: Mapping[str, np.ndarray],
                       metadata: dict[str, Any]) -> VerticalModel:
    """Log ``arrays`` with ``metadata`` as a model of run ``run_id`` and register it as a
    version of ``<experiment>-final``.

    Raises
    ------
    mlflow.exceptions.MlflowException
        MLflow refused the logged model (registration failures only log a warning,
        :func:`register_version`).
    """
    info = metadata[METADATA_KEY]
    model = mlflow.initialize_logged_model(name="vertical-model", source_run_id=run_id,
                                           tags={"flow": info["flow"]})
    with tempfile.TemporaryDirectory(prefix="fedmed-vertical-") as folder:
        save_file({name: np.array(value, order="C") for name, value in arrays.items()},
                  str(Path(folder) / WEIGHTS_FILE))
        (Path(folder) / METADATA_FILE).write_text(json.dumps(metadata, indent=2))
        MlflowClient().log_model_artifacts(model.model_id, folder)
    mlflow.finalize_logged_model(model.model_id, "READY")
    uri = f"models:/{model.model_id}"
    version = register_version(uri, f"{experiment}-final", {
        "run-id": run_id, "flow": info["flow"], "rounds": str(info["rounds"]),
        "sites": ",".join(info["sites"]), "task": info["task"]})
    return VerticalModel(uri, version)
