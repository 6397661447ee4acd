"""The decoded-cache benchmark measures a real cache hit on a generated site."""

from __future__ import annotations

import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load():
    return importlib.import_module("decoded_cache")


def test_measures_decode_and_cached_start_up(tmp_path):
    row = _load().measure("cxr-cls", tmp_path, repeats=1)
    assert row["site_files"] > 10 and row["cache_mb"] > 0
    assert row["decode_s"] > 0 and row["cached_s"] > 0
    assert row["speedup"] == row["decode_s"] / row["cached_s"]
    assert len(list((tmp_path / "cxr-cls-cache").glob("cxr-cls-*.npz"))) == 1
