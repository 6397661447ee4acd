"""2.5D slab samples for PE segmentation: a stack of neighbouring slices in, the centre slice's mask out.

A 2D network sees ``slab`` consecutive axial slices as input channels, which
gives it the through-plane context needed to tell a filling defect in a vessel
running across slices from a vessel leaving the plane.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from clients.io.windowing import CTPA_LEVEL, CTPA_WIDTH, window_ct
from clients.pe_seg.data import Item

__all__ = ["SlabDataset"]

class SlabDataset(Dataset):
    """Every (study, centre slice) pair of a set of studies as a 2.5D sample.

    Item ``i`` is ``(image, target)``: ``image`` is a ``float32`` tensor
    ``(slab, H, W)``, the windowed slices ``c - slab//2 .. c + slab//2`` around
    the centre slice ``c`` (indices clamped to the volume, so edge slices are
    replicated at the borders); ``target`` is a ``float32`` tensor
    ``(1, H, W)``, the binary PE mask (``mask > 0``) of slice ``c``. Items are
    ordered study by study, slice by slice.

    The windowed (and, if ``image_size`` is set, resized) volumes are computed
    once here and cached as ``float16``, so ``__getitem__`` only slices arrays.

    Parameters
    ----------
    studies : sequence of Item
        The studies. Without ``image_size`` their in-plane sizes may differ, but
        then a ``DataLoader`` can only batch same-size items.
    slab : int, optional
        Number of slices per sample; odd and >= 1. Default 9.
    image_size : int, optional
        If given, every slice is resized in-plane to ``image_size x image_size``
        (bilinear for the image, nearest for the mask).
    level, width : float, optional
        CT window, see :func:`window_ct`.

    Raises
    ------
    ValueError
        If ``slab`` is not an odd integer >= 1, ``image_size`` is not >= 1, the
        window width is not positive, or a study's mask and volume shapes differ.
    """

    def __init__(
        self,
        studies: Sequence[Item],
        slab: int = 9,
        image_size: int | None = None,
        level: float = CTPA_LEVEL,
        width: float = CTPA_WIDTH,
    ) -> None:
        if not isinstance(slab, (int, np.integer)) or isinstance(slab, bool) or slab < 1 or slab % 2 == 0:
            raise ValueError(f"slab must be an odd integer >= 1, got {slab!r}")
        if image_size is not None and (not isinstance(image_size, (int, np.integer)) or image_size < 1):
            raise ValueError(f"image_size must be a positive integer or None, got {image_size!r}")
        if not width > 0:
            raise ValueError(f"window width must be > 0, got {width}")
        self.slab = int(slab)
        self.image_size = None if image_size is None else int(image_size)
        self.study_ids: list[str] = []
        self._images: list[torch.Tensor] = []  # float16 (z, H, W)
        self._masks: list[torch.Tensor] = []  # uint8 (z, H, W), {0, 1}
        index: list[tuple[int, int]] = []
        for s, study in enumerate(studies):
            if study.hu.shape != study.mask.shape:
                raise ValueError(
                    f"study {study.study_id}: mask shape {study.mask.shape} != volume shape {study.hu.shape}"
                )
            image = torch.from_numpy(window_ct(study.hu, level, width))
            mask = torch.from_numpy(np.ascontiguousarray(study.mask > 0).astype(np.uint8))
            if self.image_size is not None and tuple(image.shape[1:]) != (self.image_size, self.image_size):
                size = (self.image_size, self.image_size)
                # (1, z, H, W): slices as channels, so the resize is in-plane only.
                image = F.interpolate(image[None], size=size, mode="bilinear", align_corners=False)[0]
                mask = F.interpolate(mask[None].float(), size=size, mode="nearest")[0].to(torch.uint8)
            self.study_ids.append(study.study_id)
            self._images.append(image.to(torch.float16).contiguous())
            self._masks.append(mask.contiguous())
            index.extend((s, z) for z in range(image.shape[0]))
        self._index = index
        self._positive = [
            i for i, (s, z) in enumerate(index) if bool(self._masks[s][z].any())
        ]

    def __len__(self) -> int:
        return len(self._index)

    def location(self, i: int) -> tuple[str, int]:
        """Return ``(study_id, centre slice)`` of item ``i``."""
        s, z = self._index[i]
        return self.study_ids[s], z

    @property
    def positive_indices(self) -> list[int]:
        """Indices of the items whose centre slice contains PE."""
        return list(self._positive)

    @property
    def num_positive_slices(self) -> int:
        """Number of items whose centre slice contains PE."""
        return len(self._positive)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} slab samples")
        s, z = self._index[i]
        volume = self._images[s]
        half = self.slab // 2
        slices = torch.arange(z - half, z + half + 1).clamp_(0, volume.shape[0] - 1)
        image = volume.index_select(0, slices).to(torch.float32)
        target = self._masks[s][z : z + 1].to(torch.float32)
        return image, target
