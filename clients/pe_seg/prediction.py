"""PE segmentation of one CT study with a 2.5D model, back on the DICOM series' own grid.

The study is cut exactly as in training (:class:`clients.pe_seg.task.SlabDataset`:
CTPA window, in-plane resize to the model's ``image size``, ``slab`` neighbouring
slices as channels, edge slices replicated); the model predicts the centre
slice of every slab. The per-slice probabilities are resized back to the
series' in-plane size (bilinear), thresholded at 0.5 (logit 0, as in
validation) and written as a NIfTI mask on the series' affine
(:func:`clients.io.nifti.write_nifti_mask`), so it overlays the series in any
viewer (3D Slicer, ITK-SNAP) and reads back voxel for voxel.
:class:`SegmentationPredictor` is the task's predictor for ``make predict``:
``masks/<study>.nii.gz`` plus a ``findings.csv`` row per study, scored by the
mean Dice over the studies with a reference mask; the same mask goes back to the
PACS as a DICOM-SEG of one "Pulmonary embolism" segment over the source series
(:class:`clients.prediction.dicom_seg.SegmentationContent`, written by ``make predict``).
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from clients.io.dicom_series import CTVolume, read_dicom_series
from clients.io.nifti import read_nifti_mask, write_nifti_mask
from clients.pe_seg.data import Item
from clients.pe_seg.task import SlabDataset
from clients.prediction.dicom_seg import PULMONARY_EMBOLISM, SegmentationContent
from clients.prediction.items import PredictionItem, output_name
from clients.prediction.predictor import FINDINGS, MASKS, ItemResult
from clients.training.trainer import ComputeDevice
from clients.training.site_task import TaskSettings
from strategies.wire.errors import ItemError

__all__ = ["Findings", "segment_volume", "dice", "segment_study", "mask_name",
           "SegmentationPredictor"]

log = logging.getLogger(__name__)

#: Slabs per forward pass.
BATCH = 16


@dataclass(frozen=True)
class Findings:
    """What one study's predicted mask says (a row of ``findings.csv``).

    ``dice`` is ``None`` without a usable reference mask; ``mask`` is the predicted
    binary mask ``(z, y, x)`` on the series' grid (what its DICOM-SEG holds).
    """

    voxels: int
    volume_ml: float
    max_probability: float
    dice: float | None
    mask: np.ndarray | None = field(default=None, compare=False, repr=False)


@torch.no_grad()
def segment_volume(model: nn.Module, volume: CTVolume, settings: TaskSettings,
                   compute: ComputeDevice) -> np.ndarray:
    """Per-voxel PE probability of ``volume``, ``float32`` ``(z, y, x)`` on its own grid.

    Parameters
    ----------
    model : nn.Module
        The 2.5D network (``settings.slab_slices`` channels in, one logit map out), in eval mode.
    volume : CTVolume
        The study.
    settings : TaskSettings
        The model's ``image_size`` and ``slab_slices``.
    compute : ComputeDevice
        Where to run (autocast on CUDA).
    """
    blank = np.zeros(volume.shape, np.uint8)
    slabs = SlabDataset([Item("study", "", volume.hu, blank, volume.spacing)],
                        slab=settings.slab_slices, image_size=settings.image_size)
    model.to(compute.device)
    chunks = []
    for x, _ in DataLoader(slabs, batch_size=BATCH, **compute.loader_kwargs(workers=False)):
        with compute.autocast():
            logits = model(x.to(compute.device, non_blocking=True))
        chunks.append(torch.sigmoid(logits.float())[:, 0])
    probability = torch.cat(chunks)  # (z, S, S)
    height, width = volume.shape[1:]
    if tuple(probability.shape[1:]) != (height, width):
        probability = F.interpolate(probability[:, None], size=(height, width), mode="bilinear",
                                    align_corners=False)[:, 0]
    return probability.cpu().numpy().astype(np.float32)


def dice(prediction: np.ndarray, reference: np.ndarray) -> float:
    """Dice coefficient ``2 |P n R| / (|P| + |R|)`` of two binary masks (Dice, Ecology 1945).

    Both empty counts as 1 (as MONAI's ``DiceMetric(ignore_empty=False)`` of validation).
    """
    p, r = prediction > 0, reference > 0
    total = int(p.sum()) + int(r.sum())
    return 1.0 if total == 0 else 2.0 * int(np.logical_and(p, r).sum()) / total


def segment_study(model: nn.Module, series: Path, reference: Path | None, mask_path: Path,
                  settings: TaskSettings, compute: ComputeDevice) -> Findings:
    """Segment the DICOM series ``series``, write its mask to ``mask_path``, and sum up the findings.

    Parameters
    ----------
    reference : Path | None
        The site's PE mask of the study (NIfTI) for the Dice; one that does
        not read or fit the series gives ``dice = None`` (the prediction stands).

    Raises
    ------
    ItemError
        If the series is unusable (:class:`~clients.errors.DicomSeriesError`).
    """
    volume = read_dicom_series(series)
    probability = segment_volume(model, volume, settings, compute)
    mask = (probability > 0.5).astype(np.uint8)
    write_nifti_mask(mask_path, mask, volume)
    score = None
    if reference is not None:
        try:
            score = dice(mask, read_nifti_mask(reference, reference=volume))
        except ItemError as exc:
            log.warning("No Dice for %s: %s", series, exc)
    dz, dy, dx = volume.spacing
    voxels = int(mask.sum())
    return Findings(voxels=voxels, volume_ml=voxels * dz * dy * dx / 1000.0,
                    max_probability=float(probability.max()) if probability.size else 0.0,
                    dice=score, mask=mask)


def mask_name(item_id: str, taken: set[str]) -> str:
    """A file name ``<id>.nii.gz`` for a study's mask: unsafe characters replaced, unique in ``taken``."""
    return output_name(item_id, ".nii.gz", taken)


class SegmentationPredictor:
    """A NIfTI mask per study in ``<out>/masks`` and its ``findings.csv`` row.

    Parameters
    ----------
    model : nn.Module
        The 2.5D network, in eval mode.
    settings : TaskSettings
        Its ``image_size`` and ``slab_slices``.
    compute : ComputeDevice
        Where to run.
    out : Path
        The output folder (``masks/`` is created in it).
    """

    table = FINDINGS
    columns = ("mask", "voxels", "volume_ml", "max_probability", "dice")

    def __init__(self, model: nn.Module, settings: TaskSettings, compute: ComputeDevice,
                 out: Path) -> None:
        self.model, self.settings, self.compute = model, settings, compute
        self.masks = out / MASKS
        self.masks.mkdir(parents=True, exist_ok=True)
        self._taken: set[str] = set()
        self._dices: list[float] = []

    def predict(self, item: PredictionItem) -> ItemResult:
        """Segment the item's series (see :func:`segment_study`) and return its findings row."""
        name = mask_name(item.item_id, self._taken)
        found = segment_study(self.model, item.image, item.reference, self.masks / name,
                              self.settings, self.compute)
        self._dices += [] if found.dice is None else [found.dice]
        return ItemResult([f"{MASKS}/{name}", found.voxels, found.volume_ml, found.max_probability,
                           found.dice], f"{found.voxels} voxels ({found.volume_ml:.2f} ml)",
                          SegmentationContent(found.mask, item.image, PULMONARY_EMBOLISM))

    def metric(self) -> float | None:
        """Mean Dice over the studies with a usable reference mask."""
        return statistics.fmean(self._dices) if self._dices else None
