"""The PE segmentation task of a site: data, model, loss, local training, metrics.

Ties the site's studies (DICOM series + NIfTI PE masks, :mod:`clients.pe_seg.data`)
to the 2.5D U-Net (:func:`models.unet25d.make_unet25d`): 9-slice slabs in,
centre-slice mask out. Loss is MONAI's soft Dice loss (Milletari et al., V-Net,
3DV 2016, eq. 1) computed over the whole batch, so slices without emboli do not
produce undefined per-slice terms; the validation metric is MONAI's Dice
(per study, on the 3D mask assembled from the centre-slice predictions).
No Flower imports: the ClientApp calls this.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from clients.pe_seg.data import load_site
from clients.pe_seg.manifest import MANIFEST_NAME, read_manifest
from clients.pe_seg.prediction import SegmentationPredictor
from clients.prediction.items import PredictionItem
from clients.training.site_task import EvalResult, SiteTask, TaskSettings, merged_report
from clients.training.trainer import ComputeDevice, positive_share_sampler
from clients.pe_seg.slabs import SlabDataset
from models.monai_core import DiceCELoss, DiceMetric
from models.unet25d import make_unet25d

__all__ = ["PESegTask"]

log = logging.getLogger(__name__)


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
        return SegmentationPredictor(model, settings, compute, out)

    @classmethod
    def model_for(cls, settings: TaskSettings) -> nn.Module:
        """A fresh 2.5D U-Net for the slab size."""
        return make_unet25d(slab_slices=settings.slab_slices)

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
