"""Atomic on-disk site state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from clients.site.state_store import SiteStateStore


def test_save_load_round_trip_and_safe_names(tmp_path: Path):
    store = SiteStateStore(tmp_path)
    assert store.load("fed/1", "ef") is None
    path = store.save("fed/1", "ef", np.arange(5, dtype=np.float32))
    assert path.parent.parent == tmp_path  # "fed/1" cannot escape into a sub-folder
    np.testing.assert_array_equal(store.load("fed/1", "ef"), np.arange(5, dtype=np.float32))
    store.save("fed/1", "ef", np.zeros(2, dtype=np.float32))
    assert store.load("fed/1", "ef").shape == (2,)
    assert not list(path.parent.glob("*.tmp"))


def test_empty_names_are_refused(tmp_path: Path):
    with pytest.raises(ValueError):
        SiteStateStore(tmp_path).save("", "ef", np.zeros(1))


@pytest.mark.parametrize("federation", ["..", ".", "..."])
def test_dot_only_federation_names_cannot_leave_the_state_dir(tmp_path: Path, federation: str):
    # #12: the federation name comes from the server's message; ".." wrote beside the state dir.
    state = tmp_path / "state"
    with pytest.raises(ValueError, match="dot-only"):
        SiteStateStore(state).save(federation, "ef", np.zeros(1))
    assert not list(tmp_path.glob("*.npy"))
