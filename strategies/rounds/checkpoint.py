"""Server checkpoint after every round, so a crashed ServerApp or SuperLink can resume.

Holds the global model, the last finished round, the composed strategy's state
(the plug-in objects themselves: AdaComm's smoothed loss and tau, FedNova's
server momentum, the selector's counts and random state, known site sizes and
losses) and the MLflow run id, so a resumed federation continues in the same
MLflow run. Written atomically (temporary file + rename) with pickle: a
checkpoint is trusted, server-local state, never read from a site.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from strategies.errors import FederationError

__all__ = ["CheckpointError", "ServerCheckpoint", "save_checkpoint", "load_checkpoint"]

_VERSION = 1


class CheckpointError(FederationError):
    """A checkpoint is missing, unreadable or from an incompatible federation."""


@dataclass
class ServerCheckpoint:
    """Everything needed to continue a federation after ``server_round``."""

    server_round: int
    keys: list[str]
    arrays: list[np.ndarray]
    strategy: dict[str, Any]
    mlflow_run_id: str
    plugins: dict[str, str] = field(default_factory=dict)
    version: int = _VERSION


def save_checkpoint(path: Path, checkpoint: ServerCheckpoint) -> None:
    """Write ``checkpoint`` to ``path`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            pickle.dump(checkpoint, handle, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: Path, plugins: dict[str, str]) -> ServerCheckpoint:
    """Read the checkpoint at ``path``, checking it was made with the same plug-ins.

    Raises
    ------
    CheckpointError
        If it is missing, unreadable, of another format version, or its plug-in
        names differ from ``plugins`` (resuming FedAvg state into FedNova would
        silently mix two federations).
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no checkpoint to resume from")
    try:
        with open(path, "rb") as handle:
            checkpoint = pickle.load(handle)  # noqa: S301 - trusted, server-local file
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError) as exc:
        # ImportError: written by a version whose classes lived in other modules
        raise CheckpointError(f"{path}: unreadable checkpoint ({exc})") from exc
    if not isinstance(checkpoint, ServerCheckpoint) or checkpoint.version != _VERSION:
        raise CheckpointError(f"{path}: not a version-{_VERSION} server checkpoint")
    if checkpoint.plugins != plugins:
        raise CheckpointError(
            f"{path}: made with plug-ins {checkpoint.plugins}, the run config asks for "
            f"{plugins}; resume with the same strategy settings")
    return checkpoint
