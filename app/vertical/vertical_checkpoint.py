"""A vertical federation's checkpoint after each round, and its resume (``resume = true``).

The horizontal federation's checkpoint, reused as it is (:mod:`strategies.rounds.checkpoint`):
the same folder ``<checkpoint-dir>/<federation id>/`` (0700), the same file
(:data:`~strategies.rounds.checkpoint.CHECKPOINT_FILE`, one ``.npz`` read without pickle),
the same run-config check on resume (only ``resume`` and ``num-server-rounds`` may
differ), and the same MLflow outbox beside it. What a vertical round leaves:

- the checkpoint's model arrays: the coordinator's own arrays, by name (pvFed: the global
  encoder, ``global-encoder.*``; split learning: its part ``middle/*``, the sites' part
  ``part/*`` it hands out and its optimiser's state ``optimiser/middle/*``, named as a
  site keeps its own);
- its ``strategy`` state tree: the method's state between rounds (pvFed: the local
  encoders that came back, by department), the sites' last metrics and the PSI's
  intersection size.

What the sites keep between rounds lives in their own state folders, keyed by the
federation id (the MLflow run id when MLflow answered at the start; one of the
federation's own otherwise, :mod:`app.tracking.run_start`): a resume of the same
federation finds it there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.config.run_config import RunConfig
from app.tracking import FederationTracker
from strategies.rounds.checkpoint import (CHECKPOINT_FILE, ServerCheckpoint,
                                          find_checkpoint, load_checkpoint, run_folder,
                                          save_checkpoint)

__all__ = ["VerticalCheckpoint", "open_checkpoint", "resumed_checkpoint"]


@dataclass
class VerticalCheckpoint:
    """Where a vertical federation checkpoints, and what it resumed from.

    Attributes
    ----------
    path : Path or None
        The checkpoint file (``None``: no ``checkpoint-dir``, nothing is kept).
    run_id : str
        The federation id (its checkpoint folder's name; the MLflow run id when MLflow
        answered at the start).
    run_config : dict
        The run config it was started with (:meth:`RunConfig.as_params`).
    resumed : ServerCheckpoint or None
        The checkpoint a resume continues from (``None``: a fresh federation).
    """

    path: Path | None
    run_id: str
    run_config: dict[str, Any]
    resumed: ServerCheckpoint | None = None

    @property
    def first_round(self) -> int:
        """The first round this process runs (1, or the one after the checkpoint's)."""
        return 1 if self.resumed is None else self.resumed.server_round + 1

    def arrays(self) -> dict[str, np.ndarray]:
        """The resumed checkpoint's coordinator arrays, by name (``{}``: fresh)."""
        if self.resumed is None:
            return {}
        return dict(zip(self.resumed.keys, self.resumed.arrays))

    def state(self) -> dict[str, Any]:
        """The resumed checkpoint's method state (``{}``: fresh)."""
        return {} if self.resumed is None else dict(self.resumed.strategy)

    def save(self, server_round: int, arrays: dict[str, np.ndarray],
             state: dict[str, Any]) -> None:
        """Keep round ``server_round``'s coordinator ``arrays`` and method ``state`` (atomic)."""
        if self.path is None:
            return
        save_checkpoint(self.path, ServerCheckpoint(
            server_round=server_round, keys=list(arrays), arrays=list(arrays.values()),
            strategy=state, mlflow_run_id=self.run_id, run_config=self.run_config))


def resumed_checkpoint(config: RunConfig, tracker: FederationTracker,
                       flwr_run_id: str) -> VerticalCheckpoint | None:
    """With ``resume``: the newest checkpoint of this run config, its MLflow run reopened.

    Raises
    ------
    CheckpointError
        No checkpoint of this run config under ``checkpoint-dir``, or one whose MLflow run
        is not its folder's.
    """
    if not config.resume:
        return None
    run_config, defaults = config.as_params(), RunConfig().as_params()
    path = find_checkpoint(Path(config.checkpoint_dir), run_config, defaults)
    checkpoint = load_checkpoint(path, run_config, defaults=defaults)
    run_id = tracker.resume(checkpoint.mlflow_run_id, checkpoint.server_round,
                            flwr_run_id=flwr_run_id, outbox_dir=path.parent)
    return VerticalCheckpoint(path, run_id, run_config, checkpoint)


def open_checkpoint(config: RunConfig, tracker: FederationTracker,
                    run_id: str) -> VerticalCheckpoint:
    """A fresh federation's checkpoint (its folder made, the outbox moved there)."""
    if not config.checkpoint_dir:
        return VerticalCheckpoint(None, run_id, config.as_params())
    folder = run_folder(Path(config.checkpoint_dir), run_id)
    tracker.use_outbox(folder)
    return VerticalCheckpoint(folder / CHECKPOINT_FILE, run_id, config.as_params())
