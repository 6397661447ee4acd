"""The held-out test split of the sites written from the shared sets (issue 15, item 4)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from clients.datagen.held_out import HeldOutPool, held_out_rng, move_share, splits_of

REAL_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


def test_a_share_moves_to_test_and_one_item_always_stays() -> None:
    splits = splits_of(np.array([False] * 8 + [True] * 2))
    moved = move_share(splits, "train", 0.2, held_out_rng(0))
    assert list(moved).count("test") == 2 and list(moved).count("val") == 2
    assert list(splits).count("test") == 0  # a new array
    assert list(move_share(splits, "val", 0.9, held_out_rng(0))).count("val") == 1
    assert (move_share(splits, "train", 0.2, held_out_rng(0)) == moved).all()  # seeded


def test_the_pool_hands_out_each_item_once() -> None:
    pool = HeldOutPool(np.arange(100, 110), held_out_rng(1))
    first, second, third = pool.take(20, 0.2), pool.take(30, 0.2), pool.take(40, 0.2)
    assert (first.size, second.size, third.size) == (4, 6, 0)
    assert sorted(np.concatenate([first, second]).tolist()) == list(range(100, 110))
    assert HeldOutPool(np.arange(5), held_out_rng(1)).take(3, 0.0).size == 0


def _ids(site: Path) -> dict[str, list[str]]:
    from clients.cxr_cls.manifest import read_manifest

    out: dict[str, list[str]] = {}
    for row in read_manifest(site):
        out.setdefault(row.split, []).append(row.image_id)
    return out


def test_medmnist_sites_take_test_items_from_the_source_test_split(tmp_path: Path) -> None:
    from clients.datagen.shared import convert

    if not (REAL_DATA / "cxr2d" / "pneumoniamnist_balanced.npz").is_file():
        pytest.skip(f"real data not found at {REAL_DATA} (../shared/data is optional)")
    quiet = dict(log=lambda _: None, max_per_site=20, seed=3)
    with_test = convert("cxr-cls", REAL_DATA, tmp_path / "a", 2, "iid", **quiet)
    without = convert("cxr-cls", REAL_DATA, tmp_path / "b", 2, "iid", test_fraction=0.0, **quiet)
    for summary, plain in zip(with_test, without):
        ids, plain_ids = _ids(tmp_path / "a" / summary.name), _ids(tmp_path / "b" / plain.name)
        assert summary.test == 4 == len(ids["test"]) and plain.test == 0 and "test" not in plain_ids
        assert all(i.startswith("pnm-test-") for i in ids["test"])
        assert (ids["train"], ids["val"]) == (plain_ids["train"], plain_ids["val"])
        assert f"{summary.test} test" in (tmp_path / "a" / summary.name / "SOURCE.txt").read_text()
