"""The shared real sets of PE segmentation, as federated sites (:mod:`clients.datagen.shared`).

Both sets are written like the synthetic hospitals: per study a DICOM CT series
(:func:`clients.io.dicom_writer.write_dicom_series`) + a NIfTI mask on the same
grid + ``manifest.csv`` (:mod:`clients.pe_seg.manifest`), read by
:mod:`clients.pe_seg.data`.

* ``ctpa``: ``ctpa/pulmonary_ct.nii.gz`` (one CTPA-like contrast chest CT, HU)
  and its **pulmonary-artery** mask (TotalSegmentator output, not a manual
  label and **not** pulmonary embolism) -> contiguous z-blocks of
  ``--block-slices`` slices, each a study. All blocks come from one patient; a
  seeded share of a site's training blocks is its held-out ``test`` split
  (:mod:`clients.datagen.held_out`).
  The aorta CTA of the same folder is not added: its mask labels the aorta, and
  in the pulmonary CT the aorta is background, so the two studies would
  contradict each other.
* ``msd-lung``: ``seg2d/msd_lung_tumour_patches_{val,test}.npz`` (48x48 CT
  patches, manual lung-tumour masks, Medical Segmentation Decathlon Task06) ->
  one single-slice study per patch. The patches come pre-normalised to [0, 1]
  (not HU): a value ``v`` is stored as the pseudo-HU ``-250 + 700 v``
  (:data:`MSD_LOW_HU`, :data:`MSD_WIDTH_HU`), so the task's CTPA window
  (:func:`clients.io.windowing.window_ct`, [-250, 450] HU) gives ``v`` back; the
  DICOM RescaleType is ``US`` (unspecified), not ``HU``. Every site trains on
  patches of the ``val`` file and validates on patches of the ``test`` file,
  which come from other patients; a seeded share of those ``test``-file
  patches is the site's held-out ``test`` split (:mod:`clients.datagen.held_out`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from clients.datagen.shared_set import SharedSet, SiteItems, set_registry, source_path
from clients.io.dicom_series import CTVolume
from clients.io.dicom_writer import write_dicom_series
from clients.io.nifti import nifti_ct_volume, read_nifti_mask, write_nifti_mask
from clients.io.windowing import CTPA_LEVEL, CTPA_WIDTH
from clients.pe_seg.manifest import ManifestRow, write_manifest
from strategies.wire.registry import Registry

__all__ = ["MSD_LOW_HU", "MSD_WIDTH_HU", "CTPA", "MSD_LUNG", "SETS"]

#: Pseudo-HU map of the pre-normalised MSD patches: ``hu = MSD_LOW_HU + MSD_WIDTH_HU * v``, the
#: task's CTPA window, so :func:`clients.io.windowing.window_ct` returns ``v``.
MSD_LOW_HU = CTPA_LEVEL - CTPA_WIDTH / 2.0
MSD_WIDTH_HU = CTPA_WIDTH
#: The MSD patches are multiples of 1/1100 (integers over an 1100-wide grid); storing ``k = 1100 v``
#: with RescaleSlope ``700 / 1100`` is lossless.
_MSD_LEVELS = 1100
#: HU range a 12-bit DICOM series with intercept -1024 holds.
_DICOM_HU_RANGE = (-1024.0, 3071.0)
_STUDY_DIR = "studies"
_MASK_NAME = "mask.nii.gz"


def _uid_seed(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("/".join(parts).encode()).digest()[:7], "big")


def _write_seg_site(site_dir: Path, studies: list[tuple[str, CTVolume, np.ndarray, dict]],
                    splits: np.ndarray, dicom_kwargs: dict) -> None:
    """Write ``(study_id, volume, mask, header)`` studies as DICOM series + NIfTI masks + manifest.csv."""
    rows = []
    for (study_id, volume, mask, header), split in zip(studies, splits):
        study_dir = site_dir / _STUDY_DIR / study_id
        write_dicom_series(study_dir / "dicom", volume, patient_id=study_id, uid_seed=_uid_seed(study_id),
                           header=header, **dicom_kwargs)
        write_nifti_mask(study_dir / _MASK_NAME, mask, volume)
        rows.append(ManifestRow(study_id, str(split), study_dir / "dicom", study_dir / _MASK_NAME))
    write_manifest(site_dir, rows)


def _real_header(series: str, comments: str) -> dict:
    return {"Manufacturer": "", "PatientName": "ANONYMOUS", "ContrastBolusAgent": "",
            "SeriesDescription": series[:64], "ImageComments": comments[:10240]}


def _ctpa_items(source: SharedSet, shared: Path, block_slices: int) -> SiteItems:
    if block_slices < 1:
        raise ValueError(f"block_slices must be >= 1, got {block_slices}")
    image_path, mask_path = (source_path(shared, f) for f in source.files)
    volume = nifti_ct_volume(image_path)
    mask = (read_nifti_mask(mask_path, reference=volume) > 0).astype(np.uint8)
    low, high = _DICOM_HU_RANGE
    clipped = int(np.count_nonzero((volume.hu < low) | (volume.hu > high)))
    hu = np.clip(np.rint(volume.hu), low, high).astype(np.float32)
    depth = hu.shape[0]
    if depth < block_slices:
        raise ValueError(f"{image_path}: {depth} slices, fewer than --block-slices {block_slices}")
    bounds = np.linspace(0, depth, depth // block_slices + 1).round().astype(int)
    normal, dz = np.asarray([0.0, 0.0, 1.0]), volume.spacing[0]
    blocks, labels, ids = [], [], []
    for z0, z1 in zip(bounds[:-1], bounds[1:]):
        study_id = f"ctpa-z{z0:03d}-{z1 - 1:03d}"
        block = CTVolume(hu[z0:z1], volume.spacing, tuple(np.asarray(volume.origin) + z0 * dz * normal),
                         volume.orientation)
        header = _real_header(
            f"TotalSegmentator test CT, slices {z0}-{z1 - 1}",
            "Block of ../shared/data/ctpa/pulmonary_ct.nii.gz (TotalSegmentator test file, Apache-2.0); "
            "mask = TotalSegmentator pulmonary artery, not pulmonary embolism.")
        blocks.append((study_id, block, mask[z0:z1], header))
        labels.append(int(mask[z0:z1].any()))
        ids.append(study_id)

    def write(site_dir: Path, idx: np.ndarray, splits: np.ndarray) -> None:
        _write_seg_site(site_dir, [blocks[i] for i in idx], splits, {})

    note = (f"Volume: {hu.shape[0]} x {hu.shape[1]} x {hu.shape[2]} (z, y, x) voxels, "
            f"{len(blocks)} blocks of ~{block_slices} slices, {sum(labels)} with a non-empty mask; "
            f"{clipped} voxels clipped to [{low:g}, {high:g}] HU.\n")
    return SiteItems(np.asarray(labels, dtype=np.int64), ids, write, note=note)


def _msd_items(source: SharedSet, shared: Path, block_slices: int) -> SiteItems:
    patches, labels, ids, from_test = [], [], [], []
    for relpath in source.files:
        path = source_path(shared, relpath)
        part = "test" if relpath.endswith("_test.npz") else "val"
        with np.load(path) as data:
            if "images" not in data or "labels" not in data:
                raise ValueError(f"{path}: missing images / labels")
            images, masks = np.asarray(data["images"], dtype=np.float64), np.asarray(data["labels"])
        if images.ndim != 4 or images.shape[1] != 1 or images.shape != masks.shape:
            raise ValueError(f"{path}: expected images and labels of shape (n, 1, h, w), "
                             f"got {images.shape} and {masks.shape}")
        levels = images * _MSD_LEVELS
        if images.min() < 0 or images.max() > 1 or np.abs(levels - np.rint(levels)).max() > 1e-3:
            raise ValueError(f"{path}: images are not multiples of 1/{_MSD_LEVELS} in [0, 1]")
        for i in range(images.shape[0]):
            patches.append((np.rint(levels[i]).astype(np.float32), (masks[i] > 0).astype(np.uint8)))
            labels.append(int(masks[i].any()))
            ids.append(f"msd-{part}-{i:03d}")
            from_test.append(part == "test")
    slope = MSD_WIDTH_HU / _MSD_LEVELS

    def write(site_dir: Path, idx: np.ndarray, splits: np.ndarray) -> None:
        studies = []
        for i in idx:
            levels, mask = patches[i]
            size = levels.shape[-1]
            corner = -(size - 1) / 2 * 2.0
            volume = CTVolume(MSD_LOW_HU + slope * levels, (2.0, 2.0, 2.0), (corner, corner, 0.0),
                              (1.0, 0.0, 0.0, 0.0, 1.0, 0.0))
            header = _real_header(
                "MSD Task06 lung patch, pseudo-HU",
                f"Pre-normalised intensity v in [0,1] stored as pseudo-HU {MSD_LOW_HU:g} + {MSD_WIDTH_HU:g} v; "
                "NOT Hounsfield units. Medical Segmentation Decathlon Task06, CC BY-SA 4.0.")
            header["RescaleType"] = "US"
            studies.append((ids[i], volume, mask, header))
        _write_seg_site(site_dir, studies, splits,
                        {"rescale_slope": slope, "rescale_intercept": MSD_LOW_HU})

    return SiteItems(np.asarray(labels, dtype=np.int64), ids, write, fixed_val=np.asarray(from_test))


CTPA = SharedSet(
    "ctpa", "pe-seg", ("ctpa/pulmonary_ct.nii.gz", "ctpa/pulmonary_ct_pulmonary_artery_mask.nii.gz"),
    "One CTPA-like contrast chest CT (crop around the pulmonary trunk, 1.5 mm isotropic, HU),\n"
    "cut into contiguous axial z-blocks; every block is one study (a DICOM CT series + a NIfTI\n"
    "mask on the same grid). HU values below -1024 or above 3071 are clipped to fit 12-bit\n"
    "DICOM (all outside the [-250, 450] HU window the task uses, so its input is unchanged).\n"
    "Label: the PULMONARY ARTERY (vessel tree) mask produced by the TotalSegmentator model\n"
    "(the TotalSegmentator test reference), not a manual annotation. This is NOT a pulmonary\n"
    "embolism label: a model trained here segments the pulmonary arteries, the vessels in\n"
    "which emboli sit, and says nothing about emboli.\n"
    "All studies come from ONE patient: validation blocks are spatially disjoint from the\n"
    "training blocks but neighbour them, so validation measures generalisation along the\n"
    "body axis of this patient, not to new patients. A seeded share of a site's training\n"
    "blocks is its held-out test split.\n"
    "Cite: Wasserthal et al., TotalSegmentator, Radiology: Artificial Intelligence 2023.\n",
    "License: Apache-2.0 (TotalSegmentator repository test files). "
    "Real public data: do not commit it into the repository.\n",
    _ctpa_items,
)

MSD_LUNG = SharedSet(
    "msd-lung", "pe-seg",
    ("seg2d/msd_lung_tumour_patches_val.npz", "seg2d/msd_lung_tumour_patches_test.npz"),
    "Medical Segmentation Decathlon Task06 (lung): 48x48 CT patches at 2 mm with MANUAL\n"
    "lung-tumour masks; every patch is one single-slice study (a one-file DICOM CT series +\n"
    "a NIfTI mask). Label: 1 = lung tumour (non-small-cell lung cancer), 0 = background.\n"
    "This is NOT a pulmonary embolism label.\n"
    "Intensities: the patches are distributed pre-normalised to [0, 1], not in HU. A value v\n"
    f"is stored as the pseudo-HU {MSD_LOW_HU:g} + {MSD_WIDTH_HU:g} * v (RescaleSlope {MSD_WIDTH_HU:g}/"
    f"{_MSD_LEVELS}, RescaleIntercept {MSD_LOW_HU:g},\n"
    "RescaleType US), so the task's CTPA window [-250, 450] gives v back (lossless: v is a\n"
    f"multiple of 1/{_MSD_LEVELS}). These numbers are NOT Hounsfield units.\n"
    "Split: every site trains on patches of the 'val' file and validates on patches of the\n"
    "'test' file; the two files come from disjoint patients, so validation is on unseen\n"
    "patients. A seeded share of a site's 'test'-file patches is its held-out test split.\n"
    "Patient ids are not distributed, so patches of one patient may sit at\n"
    "several sites.\n"
    "Cite: Antonelli et al., The Medical Segmentation Decathlon, Nat Commun 2022.\n",
    "License: CC BY-SA 4.0 (share-alike applies to this data and to data derived from it). "
    "Real public data: do not commit it into the repository.\n",
    _msd_items,
)

#: The task's shared sets by name (listed, default first, in :data:`clients.registry.TASKS`).
SETS: Registry[SharedSet] = set_registry(CTPA, MSD_LUNG)
