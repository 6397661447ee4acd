"""A site folder for the console's tests: an empty state dir and a copy of the default policy."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def site_folder(tmp_path: Path) -> tuple[Path, Path]:
    """``(state dir, policy file)`` under ``tmp_path``; the policy is configs/site-policy.toml."""
    state = tmp_path / "state"
    state.mkdir()
    policy = tmp_path / "policy.toml"
    shutil.copy(ROOT / "configs" / "site-policy.toml", policy)
    return state, policy
