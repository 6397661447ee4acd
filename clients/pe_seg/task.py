"""The PE segmentation task of a site: 2.5D slabs, model, loss, local training, metrics.

Ties the site's studies (DICOM series + NIfTI PE masks, :mod:`clients.pe_seg.data`)
to the 2.5D U-Net (:func:`models.unet25d.make_unet25d`): 9-slice slabs in,
centre-slice mask out. A 2D network sees ``slab`` consecutive axial slices as
input channels (:class:`SlabDataset`), which gives it the through-plane context
needed to tell a filling defect in a vessel running across slices from a vessel
leaving the plane. Loss is MONAI's soft Dice loss (Milletari et al., V-Net,
3DV 2016, eq. 1) computed over the whole batch, so slices without emboli do not
produce undefined per-slice terms; the validation metric is MONAI's Dice
(per study, on the 3D mask assembled from the centre-slice predictions).
No Flower imports: the ClientApp calls this.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from clients.io.windowing import CTPA_LEVEL, CTPA_WIDTH, window_ct
from clients.pe_seg.data import Item, load_site
from clients.pe_seg.manifest import MANIFEST_NAME, read_manifest
from clients.prediction.items import PredictionItem
from clients.training.site_task import EvalResult, SiteTask, TaskSettings, merged_report
from clients.training.trainer import ComputeDevice, positive_share_sampler
from models.monai_core import DiceCELoss, DiceMetric
from models.unet25d import make_unet25d

#: The 2.5D U-Net's widths by ``model-size``: ``small`` (the default, 0.21 M parameters,
#: for CPU runs) and ``full`` (five levels of 64 to 1,024 feature maps with two residual
#: units each, 26.0 M parameters: the width of Ronneberger et al.'s U-Net, MICCAI 2015,
#: for a GPU at 512 px; the image size must be a multiple of 16).
UNET_SIZES: dict[str, dict] = {
    "small": {"channels": (16, 32, 64, 128), "num_res_units": 1},
    "full": {"channels": (64, 128, 256, 512, 1024), "num_res_units": 2},
}

if TYPE_CHECKING:  # prediction.py cuts studies with SlabDataset: imported on use below
    from clients.pe_seg.prediction import SegmentationPredictor

__all__ = ["SlabDataset", "PESegTask"]

log = logging.getLogger(__name__)


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


class _RandomFlips(Dataset):
    """Random in-plane flips of (slab, mask) pairs: left-right and anterior-posterior.

    Cheap augmentation against the small study counts of a single hospital; the
    slab order (through-plane) is never flipped. The flips draw from torch's
    global generator, which :meth:`SiteTask.train` seeds in the training process
    and the DataLoader seeds per worker (base seed + worker id), so they are
    reproducible with and without loader workers.
    """

    def __init__(self, base: Dataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, target = self.base[i]
        flips = torch.rand(2) < 0.5
        dims = [d for d, flip in zip((-1, -2), flips.tolist()) if flip]
        if dims:
            image, target = image.flip(dims), target.flip(dims)
        return image, target


class PESegTask(SiteTask):
    """One site's PE segmentation data and the operations on it.

    Parameters
    ----------
    site_dir : Path
        The site folder holding ``manifest.csv``.
    settings : TaskSettings
        Sizes and sampling.

    Raises
    ------
    SiteDataError
        If the site has no usable study in any split (a site with only ``val`` /
        ``test`` studies loads; training on it is refused).
    """

    name = "pe-seg"
    main_metric = "dice"
    manifest_name = MANIFEST_NAME
    channels_last_ok = True
    preprocessing = ("CT series in HU, CTPA window level 100 HU / width 700 HU to [0, 1], each "
                     "axial slice resized (bilinear) to {image_size}x{image_size}; input (N, "
                     "{slab_slices}, {image_size}, {image_size}): {slab_slices} consecutive slices "
                     "as channels; output (N, 1, {image_size}, {image_size}) logits of the centre "
                     "slice's PE mask")
    item_series = True

    def __init__(self, site_dir: Path, settings: TaskSettings) -> None:
        super().__init__(site_dir, settings)
        loaded = {split: load_site(self.site_dir, split=split) for split in ("train", "val", "test")}
        self.report = merged_report(*(report for _, report in loaded.values()))
        size, slab = settings.image_size, settings.slab_slices
        train, val, test = (SlabDataset(studies, slab=slab, image_size=size) if studies else None
                            for studies, _ in loaded.values())
        self.train_set: SlabDataset | None = train
        self.val_set: SlabDataset | None = val
        self.test_set: SlabDataset | None = test
        self._require_items("study")
        log.info("%s: %d train slabs (%d with a non-empty mask), %d val slabs, %d test slabs, "
                 "%d studies skipped", self.site_dir.name, len(train) if train else 0,
                 train.num_positive_slices if train else 0, len(val) if val else 0,
                 len(test) if test else 0, len(self.report.skipped))

    def split_studies(self, split: str) -> int:
        """Studies (not slabs) in ``split``."""
        data = self.train_set if split == "train" else self.eval_set(split)
        return 0 if data is None else len(data.study_ids)

    @classmethod
    def manifest_items(cls, site_dir: Path, split: str | None,
                       settings: TaskSettings) -> list[PredictionItem]:
        """``manifest.csv`` rows: the series folder, with the study's PE mask as the reference."""
        return [PredictionItem(r.study_id, r.image_dir, r.split, reference=r.mask_path)
                for r in read_manifest(site_dir) if split is None or r.split == split]

    @classmethod
    def predictor(cls, model: nn.Module, settings: TaskSettings, compute: ComputeDevice,
                  out: Path) -> SegmentationPredictor:
        """A NIfTI mask per study on its series' grid and a ``findings.csv`` row (mean Dice)."""
        from clients.pe_seg.prediction import SegmentationPredictor  # noqa: PLC0415 - it imports this module
        return SegmentationPredictor(model, settings, compute, out)

    @classmethod
    def model_for(cls, settings: TaskSettings) -> nn.Module:
        """A fresh 2.5D U-Net for the slab size, of ``model-size`` (:data:`UNET_SIZES`)."""
        return make_unet25d(slab_slices=settings.slab_slices, **UNET_SIZES[settings.model_size])

    @classmethod
    def example_input(cls, settings: TaskSettings) -> np.ndarray:
        """One slab: (1, slab slices, image size, image size)."""
        size = settings.image_size
        return np.zeros((1, settings.slab_slices, size, size), dtype=np.float32)

    @staticmethod
    def loss_fn() -> nn.Module:
        """Soft Dice loss on logits, pooled over the batch."""
        return DiceCELoss(sigmoid=True, batch=True)

    @staticmethod
    def private_loss_fn() -> nn.Module:
        """DP-SGD's loss: Dice per slab (``batch=False``), averaged, so each slab's gradient is its own."""
        return DiceCELoss(sigmoid=True, batch=False)

    def _train_loader(self, seed: int, compute: ComputeDevice) -> DataLoader:
        """Slabs with a mask drawn at least at ``positive_fraction`` (never down-weighted)."""
        dataset = self.require_training()
        n = len(dataset)
        sampler = positive_share_sampler(n, dataset.positive_indices,
                                         self.settings.positive_fraction, seed, at_least=True)
        return DataLoader(_RandomFlips(dataset), batch_size=self.settings.batch_size,
                          sampler=sampler, drop_last=n >= self.settings.batch_size,
                          generator=torch.Generator().manual_seed(seed + 1),
                          **compute.loader_kwargs())

    @torch.no_grad()
    def _evaluate_on(self, model: nn.Module, data: SlabDataset,
                     compute: ComputeDevice) -> EvalResult:
        """Dice per study of one split (3D, from centre-slice predictions), mean over studies."""
        model.to(compute.device).eval()
        loss_fn = self.loss_fn()
        loader = DataLoader(data, batch_size=max(self.settings.batch_size, 16),
                            **compute.loader_kwargs(workers=False))
        preds, targets, loss_sum, batches = [], [], torch.zeros((), device=compute.device), 0
        for x, y in loader:
            x = x.to(compute.device, non_blocking=True)
            y = y.to(compute.device, non_blocking=True)
            with compute.autocast():
                logits = model(x)
            logits = logits.float()
            loss_sum += loss_fn(logits, y).detach()
            batches += 1
            preds.append((logits > 0).to(torch.uint8).cpu())
            targets.append(y.to(torch.uint8).cpu())
        pred, target = torch.cat(preds)[:, 0], torch.cat(targets)[:, 0]
        metric = DiceMetric(include_background=True, reduction="mean", ignore_empty=False)
        owners = [data.location(i)[0] for i in range(len(data))]
        for study_id in data.study_ids:
            rows = torch.tensor([i for i, owner in enumerate(owners) if owner == study_id])
            metric(y_pred=pred[rows][None, None], y=target[rows][None, None])
        dice = float(metric.aggregate())
        return EvalResult(num_examples=len(data), loss=float(loss_sum) / max(batches, 1),
                          metrics={"dice": dice}, num_studies=len(data.study_ids))
