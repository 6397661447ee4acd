"""Site partitions (clients.datagen.partitions) and the shared-data site converter (clients.datagen.shared)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from clients.datagen.partitions import (
    dirichlet_label_partition,
    iid_partition,
    partition,
    size_skew_partition,
    stratified_iid_partition,
)

REAL_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


def _labels(n: int = 600, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2, n)


def _assert_partition(parts: list[np.ndarray], n: int, num_sites: int, min_size: int = 1) -> None:
    assert len(parts) == num_sites
    joined = np.concatenate(parts)
    assert joined.size == n  # disjoint + cover
    assert np.array_equal(np.sort(joined), np.arange(n))
    assert min(p.size for p in parts) >= min_size


def _label_skew(parts: list[np.ndarray], labels: np.ndarray) -> float:
    """Mean absolute deviation of the sites' positive share from the global share."""
    overall = labels.mean()
    return float(np.mean([abs(labels[p].mean() - overall) for p in parts]))


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "size"])
@pytest.mark.parametrize("num_sites", [1, 3, 7])
def test_schemes_return_partitions(scheme: str, num_sites: int) -> None:
    labels = _labels()
    parts = partition(scheme, labels, num_sites, np.random.default_rng(1))
    _assert_partition(parts, labels.size, num_sites)


@pytest.mark.parametrize(("positives", "negatives", "num_sites"), [(5, 9, 3), (6, 12, 3), (1, 20, 4), (2, 1, 3)])
def test_stratified_iid_spreads_every_class(positives: int, negatives: int, num_sites: int) -> None:
    labels = np.array([1] * positives + [0] * negatives)
    for seed in range(5):
        parts = stratified_iid_partition(labels, num_sites, np.random.default_rng(seed))
        _assert_partition(parts, labels.size, num_sites)
        per_site_pos = [int(labels[p].sum()) for p in parts]
        assert max(per_site_pos) - min(per_site_pos) <= 1
        sizes = [p.size for p in parts]
        assert max(sizes) - min(sizes) <= 1


def test_dirichlet_min_size_and_class_counts() -> None:
    labels = _labels()
    parts = dirichlet_label_partition(labels, 5, 0.3, np.random.default_rng(2), min_size=20)
    _assert_partition(parts, labels.size, 5, min_size=20)


def test_dirichlet_min_size_impossible_is_clear() -> None:
    with pytest.raises(ValueError, match="min_size"):
        dirichlet_label_partition(_labels(100), 4, 0.05, np.random.default_rng(0), min_size=25, max_tries=20)


def test_small_alpha_is_more_label_skewed_than_iid() -> None:
    labels = _labels(2000)
    skews_iid, skews_dir = [], []
    for seed in range(5):
        skews_iid.append(_label_skew(iid_partition(labels.size, 5, np.random.default_rng(seed)), labels))
        skews_dir.append(_label_skew(
            dirichlet_label_partition(labels, 5, 0.1, np.random.default_rng(seed), min_size=10), labels))
    assert np.mean(skews_dir) > 3 * np.mean(skews_iid)
    assert np.mean(skews_dir) > 0.15


def test_iid_sizes_balanced_and_size_skew_unbalanced() -> None:
    sizes = [p.size for p in iid_partition(1000, 6, np.random.default_rng(0))]
    assert max(sizes) - min(sizes) <= 1
    skewed = [p.size for p in size_skew_partition(1000, 6, np.random.default_rng(0), sigma=1.5, min_size=5)]
    assert min(skewed) >= 5 and max(skewed) > 2 * min(skewed)
    _assert_partition(size_skew_partition(50, 6, np.random.default_rng(0), sigma=3.0, min_size=3), 50, 6, 3)


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "size"])
def test_deterministic_from_seed(scheme: str) -> None:
    labels = _labels()
    a = partition(scheme, labels, 4, np.random.default_rng(7))
    b = partition(scheme, labels, 4, np.random.default_rng(7))
    c = partition(scheme, labels, 4, np.random.default_rng(8))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_unknown_scheme_and_bad_arguments() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="unknown partition scheme 'quantile'.*iid, dirichlet, size"):
        partition("quantile", _labels(), 3, rng)
    with pytest.raises(ValueError, match="alpha"):
        partition("dirichlet", _labels(), 3, rng, alpha=0.0)
    with pytest.raises(ValueError, match="cannot give"):
        iid_partition(2, 3, rng)


# --- converter on the real shared data (skipped when ../shared/data is absent) ---------------


def _require(relpath: str) -> Path:
    path = REAL_DATA / relpath
    if not path.is_file():
        pytest.skip(f"real data not found at {path} (../shared/data is optional)")
    return REAL_DATA


def test_missing_shared_file_is_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from clients.datagen.shared import main

    rc = main(["--task", "cxr-cls", "--shared", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out"),
               "--sites", "2"])
    assert rc == 2
    assert "shared data file not found" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_cxr_sites_from_real_data_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from clients.cxr_cls.data import load_site
    from clients.datagen.shared import main

    shared = _require("cxr2d/pneumoniamnist_balanced.npz")
    args = ["--task", "cxr-cls", "--shared", str(shared), "--sites", "3", "--scheme", "dirichlet",
            "--alpha", "0.5", "--seed", "3", "--max-per-site", "20"]
    assert main(args + ["--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "hospital-02" in out and "pos.share" in out
    for k in range(3):
        site = tmp_path / "a" / f"hospital-{k:02d}"
        items, report = load_site(site, "train", 28, 1)
        val, _ = load_site(site, "val", 28, 1)
        assert items and not report.skipped and val
        assert len(items) + len(val) <= 20
        assert items[0].image.shape == (28, 28) and items[0].labels.shape == (1,)
        text = (site / "SOURCE.txt").read_text()
        assert "pneumonia" in text.lower() and "not a pneumothorax" in text.lower() and "CC BY 4.0" in text
    # deterministic from the seed
    assert main(args + ["--out", str(tmp_path / "b")]) == 0
    for k in range(3):
        name = f"hospital-{k:02d}/images.csv"
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()


def test_ct3d_sites_from_real_data_load(tmp_path: Path) -> None:
    from clients.ct3d_cls.data import load_site
    from clients.datagen.shared import convert

    shared = _require("ct3d/adrenalmnist3d_64.npz")
    summaries = convert("ct3d-cls", shared, tmp_path, 2, "iid", seed=0, max_per_site=6, log=lambda _: None)
    assert [(s.train + s.val, s.test) for s in summaries] == [(6, 1), (6, 1)]  # + AdrenalMNIST3D test
    site = tmp_path / "hospital-00"
    volumes, report = load_site(site, "train", (16, 32, 32))
    assert volumes and not report.skipped
    assert volumes[0][1].shape == (16, 32, 32) and volumes[0][2] in (0, 1)
    assert 0.0 <= volumes[0][1].min() and volumes[0][1].max() <= 1.0
    assert "not an emphysema label" in (site / "SOURCE.txt").read_text().lower()


def test_refuses_to_write_inside_shared(tmp_path: Path) -> None:
    from clients.datagen.shared import convert

    shared = tmp_path / "shared"
    shared.mkdir()
    with pytest.raises(ValueError, match="inside the shared data folder"):
        convert("cxr-cls", shared, shared / "sites", 2)
