"""A site's last global model on disk: round trip, and a crash mid-save leaves no model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from clients.site.last_global import LastGlobal
from clients.site.state_store import SiteStateStore

PACKED = {"model": np.arange(12, dtype=np.uint8), "layout": np.frombuffer(b"[]", np.uint8),
          "version": np.array([4], np.int64)}


def test_round_trip_per_federation(tmp_path: Path):
    LastGlobal(tmp_path, "fed-1").save(PACKED)
    loaded = LastGlobal(tmp_path, "fed-1").load()
    assert {k: v.tolist() for k, v in loaded.items()} == {k: v.tolist() for k, v in PACKED.items()}
    assert LastGlobal(tmp_path, "fed-2").load() is None


def test_crash_between_writes_leaves_no_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    LastGlobal(tmp_path, "fed-1").save(PACKED)
    original = SiteStateStore.save

    def crash_on_layout(self, federation, name, array):
        if name.endswith("layout"):
            raise OSError("disk full")
        return original(self, federation, name, array)

    monkeypatch.setattr(SiteStateStore, "save", crash_on_layout)
    newer = {**PACKED, "model": np.zeros(12, np.uint8), "version": np.array([5], np.int64)}
    with pytest.raises(OSError):
        LastGlobal(tmp_path, "fed-1").save(newer)
    assert LastGlobal(tmp_path, "fed-1").load() is None


@pytest.mark.parametrize("bad", [{"model": PACKED["model"]},
                                 {**PACKED, "version": np.array([0], np.int64)}])
def test_incomplete_or_unversioned_model_refused(tmp_path: Path, bad: dict):
    with pytest.raises(ValueError, match="last global model"):
        LastGlobal(tmp_path, "fed-1").save(bad)
