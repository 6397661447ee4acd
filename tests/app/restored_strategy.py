"""The strategy a federation's last checkpoint restores (engine tests of resumable state)."""

from __future__ import annotations

from pathlib import Path

from app.config.run_config import RunConfig
from app.engine import full_run_config
from app.server_app import build_strategy
from strategies.rounds.checkpoint import CHECKPOINT_FILE, ServerCheckpoint, load_checkpoint
from strategies.rounds.federated_strategy import FederatedStrategy


def restored_strategy(folder: Path, overrides: dict) -> tuple[ServerCheckpoint, FederatedStrategy]:
    """The last checkpoint under ``folder`` (a ``checkpoint-dir``) and the strategy that the run
    config ``overrides`` builds, restored from it."""
    path = next(folder.glob(f"*/{CHECKPOINT_FILE}"))
    config = RunConfig.from_mapping(full_run_config(overrides))
    strategy = build_strategy(config, federation=path.parent.name)
    checkpoint = load_checkpoint(path, config.as_params(), template=strategy.snapshot(),
                                 defaults=RunConfig().as_params())
    strategy.restore(checkpoint.strategy)
    return checkpoint, strategy
