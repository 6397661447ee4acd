"""Per-federation site state expires under the documented rule; the privacy ledgers, the
decoded cache and anything the product did not write are never removed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from clients.site.decoded_cache import CACHE_DIR_NAME
from clients.site.privacy_ledger import PRIVACY_DIR
from clients.site.state_retention import expire_federation_states
from clients.site.state_store import SiteStateStore

DAY = 86400.0


def _age(folder: Path, days: float) -> None:
    """Make ``folder`` and everything in it look untouched for ``days`` days."""
    then = time.time() - days * DAY
    for path in [folder, *folder.rglob("*")]:
        os.utime(path, (then, then))


def _state_dir(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    store = SiteStateStore(state)
    for federation in ("old-fed", "fresh-fed", "old-but-touched"):
        store.save(federation, "ef-residual", np.zeros(3, np.float32))
        store.save(federation, "queries-answered", np.array(2))
    (state / PRIVACY_DIR / "0123456789abcdef").mkdir(parents=True)
    (state / PRIVACY_DIR / "0123456789abcdef" / "history.json").write_text("[]")
    (state / CACHE_DIR_NAME).mkdir()
    (state / CACHE_DIR_NAME / "pe-seg.npz").write_bytes(b"x")
    (state / "hospital-notes").mkdir()
    (state / "hospital-notes" / "notes.txt").write_text("not the product's")
    (state / "with-a-subfolder" / "inner").mkdir(parents=True)
    (state / "with-a-subfolder" / "a.npy").write_bytes(b"x")
    for folder in state.iterdir():
        _age(folder, 45)
    _age(state / "fresh-fed", 3)
    (state / "old-but-touched" / "queries-answered.npy").touch()  # used today
    return state


def test_only_the_products_federation_folders_untouched_longer_expire(tmp_path):
    state = _state_dir(tmp_path)
    removed = expire_federation_states(state, 30)
    assert removed == [state / "old-fed"]
    assert sorted(p.name for p in state.iterdir()) == sorted(
        ["fresh-fed", "old-but-touched", PRIVACY_DIR, CACHE_DIR_NAME, "hospital-notes",
         "with-a-subfolder"])
    assert expire_federation_states(state, 0) == []  # 0 keeps everything
    assert expire_federation_states(state, 2) == [state / "fresh-fed"]
    assert expire_federation_states(tmp_path / "absent", 30) == []
    with pytest.raises(ValueError, match="state-retention-days"):
        expire_federation_states(state, -1)
