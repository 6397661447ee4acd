"""The MLflow pyfunc of a logged model, as models-from-code: the product's network and its weights.

:func:`app.tracking.model_logging.log_task_model` logs this file as the model's code
(``mlflow.pyfunc.log_model(python_model=<this file>)``) with the weights as the
artifact ``weights`` (safetensors) and the ``fedmed`` metadata as the model config.
``mlflow.pyfunc.load_model(uri)`` runs this file: :meth:`TaskPyfunc.load_context`
builds the network from the product's code (:func:`app.model_source.network_from`,
which needs the product importable) and copies the tensors in; nothing is unpickled.
``predict`` takes an ``(N, ...)`` float32 array of any batch size ``N`` and returns the
network's outputs (logits) for it.

MLflow runs the copy of this file that the model folder holds: load with pyfunc only
models of your own store. A hospital applies a model it was handed with ``make
predict``, which reads the folder's weights and metadata and runs no file from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch

__all__ = ["TaskPyfunc"]


class TaskPyfunc(mlflow.pyfunc.PythonModel):
    """A task's network with its logged weights, predicting on float32 batches."""

    def load_context(self, context: Any) -> None:
        """Build the network of ``context.model_config`` (the ``fedmed`` entry) and load the weights."""
        from app.model_source import network_from  # noqa: PLC0415 - the product, at load time
        from app.tracking.model_folder import WEIGHTS_ARTIFACT  # noqa: PLC0415

        weights = Path(context.artifacts[WEIGHTS_ARTIFACT])
        self.network = network_from(context.model_config, weights, str(weights)).eval()

    def predict(self, context: Any, model_input: np.ndarray,
                params: dict[str, Any] | None = None) -> np.ndarray:
        """The network's outputs for the batch ``model_input`` (``(N, ...)``, any ``N``)."""
        batch = torch.from_numpy(np.ascontiguousarray(model_input, dtype=np.float32))
        with torch.no_grad():
            return self.network(batch).numpy()


mlflow.models.set_model(TaskPyfunc())
