"""Tests for clients.pe_seg.task.SlabDataset: CT windowing and 2.5D slab samples."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from clients.pe_seg.data import Item, load_site
from clients.io.windowing import window_ct
from clients.pe_seg.task import SlabDataset


def _study(study_id: str, num_slices: int, size: int = 16) -> Item:
    """Slice k is constant HU -250 + 100 k; its mask marks k pixels of row 0."""
    hu = np.stack([np.full((size, size), -250.0 + 100.0 * k, np.float32) for k in range(num_slices)])
    mask = np.zeros(hu.shape, np.uint8)
    for k in range(num_slices):
        mask[k, 0, :k] = 1
    return Item(study_id, "train", hu, mask, (2.0, 1.0, 1.0))


def test_window_ct_is_the_ctpa_window() -> None:
    hu = np.array([-1000.0, -250.0, 100.0, 450.0, 3000.0])
    out = window_ct(hu)
    assert out.dtype == np.float32
    assert np.allclose(out, [0.0, 0.0, 0.5, 1.0, 1.0])
    assert np.allclose(window_ct(np.array([0.0, 40.0]), level=40.0, width=400.0), [0.4, 0.5])
    with pytest.raises(ValueError, match="width"):
        window_ct(hu, width=0.0)


def test_items_shapes_order_and_edge_replication() -> None:
    ds = SlabDataset([_study("a", 5), _study("b", 3)], slab=3)
    assert len(ds) == 8
    assert [ds.location(i) for i in (0, 4, 5, 7)] == [("a", 0), ("a", 4), ("b", 0), ("b", 2)]
    image, target = ds[0]
    assert image.dtype == torch.float32 and image.shape == (3, 16, 16)
    assert target.dtype == torch.float32 and target.shape == (1, 16, 16)

    def level(k: int) -> float:  # the CTPA window of slice k
        return (100.0 * k) / 700.0

    assert torch.allclose(image[:, 0, 0], torch.tensor([level(0), level(0), level(1)]), atol=1e-3)
    image, _ = ds[4]
    assert torch.allclose(image[:, 5, 5], torch.tensor([level(3), level(4), level(4)]), atol=1e-3)
    image, _ = ds[-1]  # study b, centre slice 2
    assert torch.allclose(image[:, 0, 0], torch.tensor([level(1), level(2), level(2)]), atol=1e-3)
    with pytest.raises(IndexError):
        ds[8]


def test_wide_slab_on_a_short_volume() -> None:
    ds = SlabDataset([_study("b", 3)], slab=9)
    image, _ = ds[1]
    expected = np.clip(np.arange(-3, 6), 0, 2)
    levels = torch.tensor([100.0 * k / 700.0 for k in expected], dtype=torch.float32)
    assert torch.allclose(image[:, 3, 3], levels, atol=1e-3)


def test_target_is_the_centre_slice_mask() -> None:
    study = _study("a", 5)
    study.mask[3, 5, 5] = 7  # any positive label counts as PE
    ds = SlabDataset([study], slab=5)
    for z in range(5):
        _, target = ds[z]
        assert torch.equal(target[0], torch.from_numpy((study.mask[z] > 0).astype(np.float32)))
    assert ds.num_positive_slices == 4 and ds.positive_indices == [1, 2, 3, 4]


def test_resize_bilinear_image_nearest_mask() -> None:
    study = _study("a", 4, size=16)
    study.hu[:] += np.linspace(0, 300, 16, dtype=np.float32)[None, None, :]
    ds = SlabDataset([study], slab=3, image_size=8)
    image, target = ds[2]
    assert image.shape == (3, 8, 8) and target.shape == (1, 8, 8)
    windowed = torch.from_numpy(window_ct(study.hu[1:4]))[None]
    expected = F.interpolate(windowed, size=(8, 8), mode="bilinear", align_corners=False)[0]
    assert torch.allclose(image, expected, atol=2e-3)
    assert set(target.unique().tolist()) <= {0.0, 1.0}
    near = F.interpolate(torch.from_numpy(study.mask[2:3] > 0).float()[None], size=(8, 8), mode="nearest")[0]
    assert torch.equal(target, near)


@pytest.mark.parametrize("slab", [0, 2, 4, -1, 3.0, True])
def test_slab_must_be_odd_positive_int(slab) -> None:
    with pytest.raises(ValueError, match="slab must be an odd integer"):
        SlabDataset([_study("a", 3)], slab=slab)


def test_slabs_from_a_generated_site(small_site) -> None:
    studies, _ = load_site(small_site)
    ds = SlabDataset(studies, slab=9, image_size=32)
    assert len(ds) == sum(s.hu.shape[0] for s in studies)
    image, target = ds[len(ds) // 2]
    assert image.shape == (9, 32, 32) and target.shape == (1, 32, 32)
    assert 0.0 <= float(image.min()) and float(image.max()) <= 1.0
    assert ds.num_positive_slices > 0


def test_real_series_nine_slice_slab_at_native_size(real_volume) -> None:
    study = Item("real", "val", real_volume.hu, np.zeros(real_volume.shape, np.uint8), real_volume.spacing)
    ds = SlabDataset([study], slab=9)
    image, target = ds[0]
    assert image.shape == (9, 512, 512) and target.shape == (1, 512, 512)
    slice0 = torch.from_numpy(window_ct(real_volume.hu[0]))
    for c in range(5):  # centre 0: channels 0..4 replicate slice 0
        assert torch.allclose(image[c], slice0, atol=1e-3)
    assert torch.allclose(image[5], torch.from_numpy(window_ct(real_volume.hu[1])), atol=1e-3)
