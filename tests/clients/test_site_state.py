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
