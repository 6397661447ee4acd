"""Random augmentation of a site's training images with MONAI transforms (``augmentation``).

Applied in the site's data pipeline, to the training batches only
(:func:`clients.training.classification.balanced_loader`): evaluation, the loss probe and
everything a reply carries (the update, its shapes, the metrics' names) are the same with
and without it. The level's ranges are in :mod:`clients.training.augmentation_levels`:
an affine transform (rotation, zoom, shift; MONAI ``RandAffine``), a contrast gamma
(``RandAdjustContrast``) and Gaussian noise (``RandGaussianNoise``), on images of shape
``(1, H, W)`` or ``(1, D, H, W)``.

Seeding follows :class:`clients.pe_seg.task._RandomFlips`: every item draws the seed of
its transforms from torch's global generator, which :meth:`SiteTask.train` seeds with the
site's round seed (:func:`strategies.wire.seeds.site_seed`) in the training process and the
DataLoader per worker (base seed + worker id), so a site's round is reproducible with and
without loader workers, and each round and site draws other transforms.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from monai.transforms import Compose, RandAdjustContrast, RandAffine, RandGaussianNoise
from monai.utils import convert_to_tensor
from torch.utils.data import Dataset

from clients.training.augmentation_levels import AUGMENTATIONS, AugmentationLevel
from strategies.wire.errors import ConfigError

__all__ = ["image_augmentation", "AugmentedImages", "augmented"]

#: MONAI's seeds are below 2**32.
_MAX_SEED = 2**32


def image_augmentation(level: AugmentationLevel, spatial_shape: Sequence[int]) -> Compose:
    """The MONAI transforms of ``level`` for channel-first images whose spatial shape is
    ``spatial_shape`` (``(H, W)`` or ``(D, H, W)``); the shift is in pixels of each side."""
    angle = math.radians(level.rotate_degrees)
    dims = len(spatial_shape)
    return Compose([
        RandAffine(prob=level.probability, rotate_range=(angle,) * (1 if dims == 2 else 3),
                   scale_range=(level.zoom,) * dims,
                   translate_range=[level.shift * side for side in spatial_shape],
                   padding_mode="zeros"),
        RandAdjustContrast(prob=level.probability, gamma=level.gamma),
        RandGaussianNoise(prob=level.probability, std=level.noise_std),
    ])


class AugmentedImages(Dataset):
    """``(image, target)`` items of ``base`` with ``image`` randomly augmented (see the module).

    Raises
    ------
    ConfigError
        Naming run-config ``augmentation``, when ``base``'s images are neither 2D nor 3D
        (``(1, H, W)`` or ``(1, D, H, W)``: a table row cannot be rotated).
    """

    def __init__(self, base: Dataset, level: AugmentationLevel) -> None:
        self.base = base
        shape = tuple(base[0][0].shape) if len(base) else (1, 1, 1)
        if len(shape) not in (3, 4):
            raise ConfigError(f"run-config 'augmentation' needs 2D or 3D images, got items of "
                              f"shape {shape}")
        self.transform = image_augmentation(level, shape[1:])

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, Any]:
        image, target = self.base[i]
        self.transform.set_random_state(seed=int(torch.randint(_MAX_SEED, ())))
        out = convert_to_tensor(self.transform(image), track_meta=False)
        return out.to(image.dtype), target


def augmented(base: Dataset, name: str) -> Dataset:
    """``base`` with the augmentation run-config ``augmentation`` names (``none``: ``base``).

    Raises
    ------
    ConfigError
        For a name not in :data:`~clients.training.augmentation_levels.AUGMENTATIONS`,
        naming the key.
    """
    level = AUGMENTATIONS.get(name)
    return AugmentedImages(base, level) if level.applies else base
