"""What a site keeps of pvFed between messages, in its federation's vertical state folder.

In deployment each message runs in a fresh process, so everything pvFed's later
stages need is a file under the site's state folder (written atomically,
safetensors for arrays: weights only, never a pickle):

* ``pvfed-local.safetensors`` -- the local model's weights and its output layer's,
  the frozen feature extractor's outputs on the aligned patients (``features``,
  ``(N, f)``), their labels and each split's positions, with the local model's
  metrics as metadata;
* ``pvfed-local-encoder.safetensors`` -- the local encoder (continued each round);
* ``pvfed-head.safetensors`` -- the last redefined output layer (the site's pvFed model
  with the extractor and the global encoder).

These files hold per-patient data of the site; they never leave it (only the local
encoder does, by the stage's reply).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import safetensors.numpy
from safetensors import safe_open
from torch import nn

from clients.site.atomic_file import write_atomic
from clients.vertical.site_data import SPLITS
from strategies.wire.errors import SiteError

__all__ = ["LOCAL_FILE", "ENCODER_FILE", "HEAD_FILE", "LocalState", "PvFedState"]

LOCAL_FILE = "pvfed-local.safetensors"
ENCODER_FILE = "pvfed-local-encoder.safetensors"
HEAD_FILE = "pvfed-head.safetensors"
_MODEL = "model."
_OUTPUT = "output."


@dataclass(frozen=True)
class LocalState:
    """The local step's outcome: extractor outputs, labels, split positions, metrics, weights."""

    features: np.ndarray
    labels: np.ndarray
    positions: dict[str, np.ndarray]
    metrics: dict[str, float]
    model: dict[str, np.ndarray]
    output: dict[str, np.ndarray]


def module_arrays(module: nn.Module) -> dict[str, np.ndarray]:
    """A module's state dict as numpy arrays by name."""
    return {name: tensor.detach().cpu().numpy().copy()
            for name, tensor in module.state_dict().items()}


def _prefixed(arrays: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The arrays named ``prefix<name>``, by ``<name>``."""
    return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}


class PvFedState:
    """The pvFed files of one site's state folder of one federation."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)

    def _write(self, name: str, arrays: Mapping[str, np.ndarray],
               metadata: Mapping[str, str] | None = None) -> Path:
        data = safetensors.numpy.save({k: np.ascontiguousarray(v) for k, v in arrays.items()},
                                      metadata=dict(metadata) if metadata else None)
        return write_atomic(self.state_dir / name, lambda handle: handle.write(data))

    def _read(self, name: str, stage: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """Arrays and metadata of file ``name``.

        Raises
        ------
        SiteError
            If the file is missing (stage ``stage`` must run first) or unreadable.
        """
        path = self.state_dir / name
        if not path.is_file():
            raise SiteError(f"{name}: no pvFed state in this federation; stage {stage!r} "
                            f"must run first")
        try:
            with safe_open(str(path), framework="numpy") as handle:
                arrays = {key: handle.get_tensor(key) for key in handle.keys()}
                metadata = handle.metadata() or {}
        except (OSError, ValueError, RuntimeError) as exc:
            raise SiteError(f"{name}: unreadable pvFed state: {exc}") from exc
        return arrays, metadata

    def save_local(self, model: nn.Module, output: nn.Linear, features: np.ndarray,
                   labels: np.ndarray, positions: Mapping[str, np.ndarray],
                   metrics: Mapping[str, float]) -> Path:
        """Keep the local step's outcome (:class:`LocalState`); ``output``: the output layer."""
        arrays = {f"{_MODEL}{k}": v for k, v in module_arrays(model).items()}
        arrays.update({f"{_OUTPUT}{k}": v for k, v in module_arrays(output).items()})
        arrays.update(features=np.asarray(features, np.float32),
                      labels=np.asarray(labels, np.float32),
                      **{f"positions.{split}": np.asarray(positions[split], np.int64)
                         for split in SPLITS})
        return self._write(LOCAL_FILE, arrays, {"metrics": json.dumps(dict(metrics))})

    def load_local(self) -> LocalState:
        """The local step's outcome.

        Raises
        ------
        SiteError
            If stage ``pvfed-local`` has not run in this federation, or its file is unreadable.
        """
        arrays, metadata = self._read(LOCAL_FILE, "pvfed-local")
        try:
            metrics = {k: float(v) for k, v in json.loads(metadata.get("metrics", "{}")).items()}
            return LocalState(
                features=arrays["features"], labels=arrays["labels"],
                positions={split: arrays[f"positions.{split}"] for split in SPLITS},
                metrics=metrics,
                model=_prefixed(arrays, _MODEL), output=_prefixed(arrays, _OUTPUT))
        except (KeyError, ValueError, TypeError) as exc:
            raise SiteError(f"{LOCAL_FILE}: incomplete pvFed state: {exc}") from exc

    def save_encoder(self, arrays: Mapping[str, np.ndarray]) -> Path:
        """Keep the local encoder's weights."""
        return self._write(ENCODER_FILE, arrays)

    def load_encoder(self) -> dict[str, np.ndarray]:
        """The local encoder's weights (:class:`SiteError` before stage ``pvfed-local``)."""
        return self._read(ENCODER_FILE, "pvfed-local")[0]

    def save_head(self, head: nn.Module) -> Path:
        """Keep the redefined output layer of the last round."""
        return self._write(HEAD_FILE, module_arrays(head))
