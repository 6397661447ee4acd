"""Turn the shared real data sets into federated site folders the readers understand.

The shared sets (``../shared/data``, see its README) are single arrays or
volumes; a federation needs hospitals. This converter splits one set into
``<out>/hospital-00``, ``hospital-01``, ... with :mod:`clients.partitions`
(IID, Dirichlet label skew or log-normal size skew) and writes each site as
real files read through the normal path:

* ``cxr-cls`` (set ``pneumoniamnist``): ``cxr2d/pneumoniamnist_balanced.npz``
  (train + val) -> 28x28 8-bit PNGs under ``images/`` and ``images.csv``
  (:mod:`clients.cxr_manifest`). The label is **pneumonia (1) vs normal (0)**,
  not pneumothorax.
* ``ct3d-cls`` (set ``adrenalmnist3d``): ``ct3d/adrenalmnist3d_64.npz`` (train +
  val) -> one uint8 ``(z, y, x)`` ``.npy`` per study under ``volumes/`` and
  ``labels.csv`` (:mod:`clients.ct3d_manifest`). The label is the
  AdrenalMNIST3D label (adrenal mass shape), **not** emphysema.
* ``pe-seg`` set ``ctpa``: ``ctpa/pulmonary_ct.nii.gz`` (one CTPA-like contrast
  chest CT, HU) and its **pulmonary-artery** mask (TotalSegmentator output, not
  a manual label and **not** pulmonary embolism) -> contiguous z-blocks of
  ``--block-slices`` slices, each a study: a DICOM CT series (the writer of
  :mod:`clients.synthetic_ct`) + a NIfTI mask on the same grid +
  ``manifest.csv`` (:mod:`clients.manifest`), read by :mod:`clients.pe_studies`.
  All blocks come from one patient. The aorta CTA of the same folder is not
  added: its mask labels the aorta, and in the pulmonary CT the aorta is
  background, so the two studies would contradict each other.
* ``pe-seg`` set ``msd-lung``: ``seg2d/msd_lung_tumour_patches_{val,test}.npz``
  (48x48 CT patches, manual lung-tumour masks, Medical Segmentation Decathlon
  Task06) -> one single-slice study per patch, written like ``ctpa``. The
  patches come pre-normalised to [0, 1] (not HU): a value ``v`` is stored as
  the pseudo-HU ``-250 + 700 v`` (:data:`MSD_LOW_HU`, :data:`MSD_WIDTH_HU`), so
  the task's CTPA window (:func:`clients.slabs.window_ct`, [-250, 450] HU) gives
  ``v`` back; the DICOM RescaleType is ``US`` (unspecified), not ``HU``. Every
  site trains on patches of the ``val`` file and validates on patches of the
  ``test`` file, which come from other patients.

Every site gets a train/val split (stratified by label for the classification
sets and ``ctpa``; fixed by source file for ``msd-lung``) and a ``SOURCE.txt``
naming the data, the meaning of the label and the license. The output is a
function of the arguments (``--seed`` included). Nothing is ever written
inside the shared folder, and a site folder this converter did not write is
never overwritten.

Usage::

    python -m clients.shared_sites --task cxr-cls --shared ../shared/data \\
        --out data/shared-cxr-cls-dirichlet0.5-seed0 --sites 4 --scheme dirichlet --alpha 0.5
    python -m clients.shared_sites --task pe-seg --set msd-lung --shared ../shared/data \\
        --out data/shared-pe-seg-msd-lung-iid-seed0 --sites 3
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clients.ct3d_manifest import LabelEntry, write_label_manifest
from clients.cxr_manifest import CXREntry, format_labels, write_cxr_manifest
from clients.dicom_series import CTVolume
from clients.manifest import StudyEntry, write_manifest
from clients.nifti_mask import read_nifti_mask, write_nifti_mask
from clients.partitions import SCHEMES, partition, stratified_iid_partition
from clients.slabs import CTPA_LEVEL, CTPA_WIDTH
from clients.synthetic_ct import write_dicom_series

__all__ = [
    "TASKS", "SETS", "SharedSet", "SOURCE_NAME", "MSD_LOW_HU", "MSD_WIDTH_HU", "SiteSummary",
    "load_shared", "nifti_ct_volume", "site_split", "convert", "main",
]

SOURCE_NAME = "SOURCE.txt"
_MARKER_LINE = "Written by clients.shared_sites"
#: Pseudo-HU map of the pre-normalised MSD patches: ``hu = MSD_LOW_HU + MSD_WIDTH_HU * v``, the
#: task's CTPA window, so :func:`clients.slabs.window_ct` returns ``v``.
MSD_LOW_HU = CTPA_LEVEL - CTPA_WIDTH / 2.0
MSD_WIDTH_HU = CTPA_WIDTH
#: The MSD patches are multiples of 1/1100 (integers over an 1100-wide grid); storing ``k = 1100 v``
#: with RescaleSlope ``700 / 1100`` is lossless.
_MSD_LEVELS = 1100
#: HU range a 12-bit DICOM series with intercept -1024 holds.
_DICOM_HU_RANGE = (-1024.0, 3071.0)
_STUDY_DIR = "studies"
_MASK_NAME = "mask.nii.gz"


@dataclass(frozen=True)
class SharedSet:
    """One shared data set and the task it feeds.

    Attributes
    ----------
    name : str
        Set name (``--set``).
    task : str
        The product task reading the written sites.
    files : tuple of str
        Source files relative to the shared folder.
    description : str
        What it is and what its label means (goes into every ``SOURCE.txt``).
    license : str
        License and citation line.
    """

    name: str
    task: str
    files: tuple[str, ...]
    description: str
    license: str


_MEDMNIST_LICENSE = "License: CC BY 4.0 (MedMNIST v2). Real public data: do not commit it into the repository.\n"

SETS: dict[str, SharedSet] = {s.name: s for s in (
    SharedSet(
        "pneumoniamnist", "cxr-cls", ("cxr2d/pneumoniamnist_balanced.npz",),
        "PneumoniaMNIST (MedMNIST v2), 28x28 chest X-rays, class-balanced subsample.\n"
        "Label: 1 = PNEUMONIA, 0 = normal. This is NOT a pneumothorax label: a model\n"
        "trained here detects pneumonia and says nothing about pneumothorax.\n"
        "Cite: Yang et al., MedMNIST v2, Sci Data 2023; Kermany et al., Cell 2018.\n",
        _MEDMNIST_LICENSE,
    ),
    SharedSet(
        "adrenalmnist3d", "ct3d-cls", ("ct3d/adrenalmnist3d_64.npz",),
        "AdrenalMNIST3D (MedMNIST v2) at 64^3: uint8 {0,255} shape masks from abdominal CT,\n"
        "saved as (z, y, x) uint8 .npy volumes.\n"
        "Label: the AdrenalMNIST3D binary label (adrenal mass shape class), 1 / 0.\n"
        "This is NOT an emphysema label, and the volumes are masks, not lung CT intensities.\n"
        "Cite: Yang et al., MedMNIST v2, Sci Data 2023.\n",
        _MEDMNIST_LICENSE,
    ),
    SharedSet(
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
        "body axis of this patient, not to new patients.\n"
        "Cite: Wasserthal et al., TotalSegmentator, Radiology: Artificial Intelligence 2023.\n",
        "License: Apache-2.0 (TotalSegmentator repository test files). "
        "Real public data: do not commit it into the repository.\n",
    ),
    SharedSet(
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
        "patients. Patient ids are not distributed, so patches of one patient may sit at\n"
        "several sites.\n"
        "Cite: Antonelli et al., The Medical Segmentation Decathlon, Nat Commun 2022.\n",
        "License: CC BY-SA 4.0 (share-alike applies to this data and to data derived from it). "
        "Real public data: do not commit it into the repository.\n",
    ),
)}

#: Task -> its shared sets; the first is the default ``--set``.
TASKS: dict[str, tuple[str, ...]] = {}
for _s in SETS.values():
    TASKS.setdefault(_s.task, ())
    TASKS[_s.task] += (_s.name,)


@dataclass(frozen=True)
class SiteSummary:
    """What one written site holds (counts only)."""

    name: str
    train: int
    val: int
    positives: int

    @property
    def total(self) -> int:
        return self.train + self.val

    @property
    def positive_share(self) -> float:
        return self.positives / self.total if self.total else 0.0


@dataclass
class _Items:
    """The partitionable items of a set: a 0/1 label each, ids, an optional fixed val split, a writer."""

    labels: np.ndarray
    ids: list[str]
    write: Callable[[Path, np.ndarray, np.ndarray], None]
    fixed_val: np.ndarray | None = None
    note: str = ""


def _resolve_set(task: str, dataset: str | None) -> SharedSet:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {', '.join(TASKS)}")
    name = dataset or TASKS[task][0]
    if name not in SETS or SETS[name].task != task:
        raise ValueError(f"unknown set {name!r} for task {task!r}; expected one of {', '.join(TASKS[task])}")
    return SETS[name]


def _source_path(shared: Path, relpath: str) -> Path:
    path = Path(shared) / relpath
    if not path.is_file():
        raise FileNotFoundError(
            f"shared data file not found: {path} (expected {relpath} under --shared {shared}; "
            "see ../shared/data/README.md)"
        )
    return path


def load_shared(task: str, shared: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The train + val images, 0/1 labels and source ids of a classification task's shared file.

    Raises
    ------
    FileNotFoundError
        If the shared file is absent (the message names it).
    ValueError
        On an unknown or non-classification task, or a file without the expected keys.
    """
    source = _resolve_set(task, None)
    if source.task not in ("cxr-cls", "ct3d-cls"):
        raise ValueError(f"load_shared reads the classification sets; {task!r} is a segmentation task")
    path = _source_path(shared, source.files[0])
    prefix = {"pneumoniamnist": "pnm", "adrenalmnist3d": "adr"}[source.name]
    images, labels, ids = [], [], []
    with np.load(path) as data:
        for split in ("train", "val"):
            key_x, key_y = f"{split}_images", f"{split}_labels"
            if key_x not in data or key_y not in data:
                raise ValueError(f"{path}: missing {key_x} / {key_y}")
            x, y = data[key_x], np.asarray(data[key_y]).reshape(-1).astype(np.int64)
            if len(x) != len(y):
                raise ValueError(f"{path}: {key_x} has {len(x)} items but {key_y} has {len(y)}")
            images.append(x)
            labels.append(y)
            ids += [f"{prefix}-{split}-{i:05d}" for i in range(len(y))]
    labels_all = np.concatenate(labels)
    if not np.isin(labels_all, (0, 1)).all():
        raise ValueError(f"{path}: labels outside {{0, 1}}: {sorted(set(labels_all.tolist()))}")
    return np.concatenate(images), labels_all, ids


def site_split(labels: np.ndarray, rng: np.random.Generator, val_fraction: float = 0.2) -> np.ndarray:
    """Boolean "is val" mask over a site's items, stratified by class where possible.

    Per class ``round(val_fraction * count)`` items go to val, keeping at least
    one in train when the class has two or more; a site of >= 2 items always
    gets at least one val item and one train item.
    """
    labels = np.asarray(labels)
    is_val = np.zeros(labels.size, dtype=bool)
    for cls in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        k = int(round(val_fraction * idx.size))
        k = min(k, idx.size - 1) if idx.size >= 2 else 0
        is_val[idx[:k]] = True
    if labels.size >= 2 and not is_val.any():
        is_val[rng.integers(labels.size)] = True
    if labels.size >= 2 and is_val.all():
        is_val[rng.integers(labels.size)] = False
    return is_val


def _with_positive_val(labels: np.ndarray, is_val: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Make sure val holds a positive study when the site has two or more (segmentation sites).

    A validation split of mask-free studies only measures false positives, so one
    positive training study is swapped with a negative validation study (the
    split sizes stay the same).
    """
    labels, is_val = np.asarray(labels), is_val.copy()
    positive = labels > 0
    if (positive & is_val).any() or positive.sum() < 2:
        return is_val
    is_val[rng.choice(np.flatnonzero(positive & ~is_val))] = True
    negative_val = np.flatnonzero(~positive & is_val)
    if negative_val.size:
        is_val[rng.choice(negative_val)] = False
    return is_val


def _is_inside(path: Path, folder: Path) -> bool:
    path, folder = path.resolve(), folder.resolve()
    return path == folder or folder in path.parents


def _prepare_site(site_dir: Path) -> None:
    """Empty a site folder written earlier by this converter; refuse anything else."""
    if site_dir.exists():
        marker = site_dir / SOURCE_NAME
        if not (marker.is_file() and _MARKER_LINE in marker.read_text(encoding="utf-8", errors="replace")):
            raise FileExistsError(f"{site_dir} exists and was not written by clients.shared_sites; refusing to overwrite")
        shutil.rmtree(site_dir)
    site_dir.mkdir(parents=True)


def _write_source(site_dir: Path, source: SharedSet, args_line: str, summary: SiteSummary, note: str) -> None:
    files = " + ".join(f"../shared/data/{f}" for f in source.files)
    what = "studies with a non-empty mask" if source.task == "pe-seg" else "positive"
    (site_dir / SOURCE_NAME).write_text(
        f"{_MARKER_LINE} ({args_line}).\n\n"
        f"Task: {source.task}\nSet: {source.name}\nSource file(s): {files}"
        + (" (train + val splits)" if source.task != "pe-seg" else "") + "\n"
        f"{source.description}{note}"
        f"{source.license}\n"
        f"This site: {summary.train} train, {summary.val} val, "
        f"{summary.positives} {what} ({summary.positive_share:.1%}).\n",
        encoding="utf-8",
    )


# --- classification sets -------------------------------------------------------------------


def _write_cxr_site(site_dir: Path, images: np.ndarray, labels: np.ndarray, ids: list[str], is_val: np.ndarray) -> None:
    from PIL import Image

    (site_dir / "images").mkdir()
    entries = []
    for image, label, image_id, val in zip(images, labels, ids, is_val):
        rel = f"images/{image_id}.png"
        Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8), mode="L").save(site_dir / rel)
        entries.append(CXREntry(image_id, "val" if val else "train", Path(rel), format_labels([int(label)])))
    write_cxr_manifest(site_dir, entries)


def _write_ct3d_site(site_dir: Path, images: np.ndarray, labels: np.ndarray, ids: list[str], is_val: np.ndarray) -> None:
    (site_dir / "volumes").mkdir()
    entries = []
    for volume, label, study_id, val in zip(images, labels, ids, is_val):
        rel = f"volumes/{study_id}.npy"
        np.save(site_dir / rel, np.ascontiguousarray(volume, dtype=np.uint8))
        entries.append(LabelEntry(study_id, "val" if val else "train", Path(rel), int(label)))
    write_label_manifest(site_dir, entries)


def _classification_items(source: SharedSet, shared: Path) -> _Items:
    images, labels, ids = load_shared(source.task, shared)
    writer = _write_cxr_site if source.task == "cxr-cls" else _write_ct3d_site

    def write(site_dir: Path, idx: np.ndarray, is_val: np.ndarray) -> None:
        writer(site_dir, images[idx], labels[idx], [ids[i] for i in idx], is_val)

    return _Items(labels, ids, write)


# --- segmentation sets (manifest.csv of DICOM series + NIfTI masks) -------------------------


def nifti_ct_volume(path: Path) -> CTVolume:
    """Read a NIfTI CT image (HU) as a :class:`~clients.dicom_series.CTVolume` with DICOM geometry.

    The array is reoriented with :mod:`nibabel.orientations` to the axes of a
    standard axial DICOM series (columns to L, rows to P, slices ascending to S,
    as :func:`clients.nifti_mask.read_nifti_mask` does for masks) and returned
    ``(z, y, x)``; the affine gives spacing, origin (LPS) and direction cosines.
    Scaling (``scl_slope`` / ``scl_inter``) is applied by nibabel.

    Raises
    ------
    ValueError
        If the file is not a 3D NIfTI with an orientation, or its axes are
        oblique or sheared (not representable by an axial DICOM series here).
    """
    import nibabel as nib
    from nibabel import orientations as ornt

    image = nib.load(path)
    header = image.header
    if int(header["sform_code"]) == 0 and int(header["qform_code"]) == 0:
        raise ValueError(f"{path}: NIfTI header has no spatial orientation")
    data = np.asarray(image.get_fdata(dtype=np.float32))
    if data.ndim != 3:
        raise ValueError(f"{path}: expected a 3D image, got shape {data.shape}")
    affine = np.asarray(image.affine, dtype=np.float64)
    transform = ornt.ornt_transform(ornt.io_orientation(affine), ornt.axcodes2ornt(("L", "P", "S")))
    data = ornt.apply_orientation(data, transform)
    affine = affine @ ornt.inv_ornt_aff(transform, image.shape)
    lps = np.diag([-1.0, -1.0, 1.0, 1.0]) @ affine
    steps = np.linalg.norm(lps[:3, :3], axis=0)
    directions = lps[:3, :3] / steps
    if not np.allclose(directions, np.eye(3), atol=1e-4):
        raise ValueError(f"{path}: oblique or sheared voxel axes are not supported ({np.round(directions, 4).tolist()})")
    dx, dy, dz = (float(v) for v in steps)
    return CTVolume(
        hu=np.ascontiguousarray(data.transpose(2, 1, 0), dtype=np.float32),
        spacing=(dz, dy, dx),
        origin=tuple(float(v) for v in lps[:3, 3]),  # type: ignore[arg-type]
        orientation=(1.0, 0.0, 0.0, 0.0, 1.0, 0.0),
    )


def _uid_seed(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("/".join(parts).encode()).digest()[:7], "big")


def _write_seg_site(site_dir: Path, studies: list[tuple[str, CTVolume, np.ndarray, dict]],
                    is_val: np.ndarray, dicom_kwargs: dict) -> None:
    """Write ``(study_id, volume, mask, header)`` studies as DICOM series + NIfTI masks + manifest.csv."""
    entries = []
    for (study_id, volume, mask, header), val in zip(studies, is_val):
        study_dir = site_dir / _STUDY_DIR / study_id
        write_dicom_series(study_dir / "dicom", volume, patient_id=study_id, uid_seed=_uid_seed(study_id),
                           header=header, **dicom_kwargs)
        write_nifti_mask(study_dir / _MASK_NAME, mask, volume)
        entries.append(StudyEntry(study_id, "val" if val else "train", study_dir / "dicom", study_dir / _MASK_NAME))
    write_manifest(site_dir, entries)


def _real_header(series: str, comments: str) -> dict:
    return {"Manufacturer": "", "PatientName": "ANONYMOUS", "ContrastBolusAgent": "",
            "SeriesDescription": series[:64], "ImageComments": comments[:10240]}


def _ctpa_items(source: SharedSet, shared: Path, block_slices: int) -> _Items:
    if block_slices < 1:
        raise ValueError(f"block_slices must be >= 1, got {block_slices}")
    image_path, mask_path = (_source_path(shared, f) for f in source.files)
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

    def write(site_dir: Path, idx: np.ndarray, is_val: np.ndarray) -> None:
        _write_seg_site(site_dir, [blocks[i] for i in idx], is_val, {})

    note = (f"Volume: {hu.shape[0]} x {hu.shape[1]} x {hu.shape[2]} (z, y, x) voxels, "
            f"{len(blocks)} blocks of ~{block_slices} slices, {sum(labels)} with a non-empty mask; "
            f"{clipped} voxels clipped to [{low:g}, {high:g}] HU.\n")
    return _Items(np.asarray(labels, dtype=np.int64), ids, write, note=note)


def _msd_items(source: SharedSet, shared: Path) -> _Items:
    patches, labels, ids, from_test = [], [], [], []
    for relpath in source.files:
        path = _source_path(shared, relpath)
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

    def write(site_dir: Path, idx: np.ndarray, is_val: np.ndarray) -> None:
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
        _write_seg_site(site_dir, studies, is_val,
                        {"rescale_slope": slope, "rescale_intercept": MSD_LOW_HU})

    return _Items(np.asarray(labels, dtype=np.int64), ids, write, fixed_val=np.asarray(from_test))


def _load_items(source: SharedSet, shared: Path, block_slices: int) -> _Items:
    if source.name == "ctpa":
        return _ctpa_items(source, shared, block_slices)
    if source.name == "msd-lung":
        return _msd_items(source, shared)
    return _classification_items(source, shared)


def convert(
    task: str,
    shared: Path,
    out: Path,
    sites: int,
    scheme: str = "iid",
    alpha: float = 0.5,
    seed: int = 0,
    max_per_site: int | None = None,
    val_fraction: float = 0.2,
    log=print,
    *,
    dataset: str | None = None,
    block_slices: int = 6,
) -> list[SiteSummary]:
    """Write ``out/hospital-00 ..`` from a shared set of ``task``; returns per-site counts.

    ``dataset`` picks the set (default: the task's first, see :data:`TASKS`);
    ``block_slices`` is the study depth of the ``ctpa`` set. Items are
    partitioned by ``scheme`` on their 0/1 label (the class for the
    classification sets, "has a non-empty mask" for the segmentation sets).
    For the segmentation sets ``iid`` is stratified by that label
    (:func:`clients.partitions.stratified_iid_partition`) and ``size`` gives
    every site at least ``min(10, n // sites)`` (>= 2) studies, so that every
    site has a training and a validation study.

    Raises
    ------
    FileNotFoundError
        If a shared file is absent.
    ValueError
        On bad arguments, if ``out`` lies inside ``shared``, or if a site of
        ``msd-lung`` gets no training or no validation patch.
    FileExistsError
        If a site folder exists that this converter did not write.
    """
    shared, out = Path(shared), Path(out)
    source = _resolve_set(task, dataset)
    if scheme not in SCHEMES:
        raise ValueError(f"unknown partition scheme {scheme!r}; expected one of {', '.join(SCHEMES)}")
    if max_per_site is not None and max_per_site < 1:
        raise ValueError(f"max_per_site must be >= 1, got {max_per_site}")
    if shared.exists() and _is_inside(out, shared):
        raise ValueError(f"--out {out} lies inside the shared data folder {shared}; never write there")
    items = _load_items(source, shared, block_slices)
    labels = items.labels
    rng = np.random.default_rng(seed)
    if source.task == "pe-seg" and scheme == "iid":
        # Few studies with a mask (6 of 18 ctpa blocks): a uniform split often leaves a site without any.
        parts = stratified_iid_partition(labels, sites, rng)
    else:
        opts = {"alpha": alpha, "min_size": min(10, len(labels) // sites)} if scheme == "dirichlet" else {}
        if scheme == "size" and source.task == "pe-seg":  # a train and a val study at every site
            opts = {"min_size": max(2, min(10, len(labels) // sites))}
        parts = partition(scheme, labels, sites, rng, **opts)
    args_line = (f"task={task}" + (f" set={source.name}" if source.task == "pe-seg" else "")
                 + f" scheme={scheme}" + (f" alpha={alpha}" if scheme == "dirichlet" else "")
                 + f" sites={sites} seed={seed}" + (f" max-per-site={max_per_site}" if max_per_site else "")
                 + (f" block-slices={block_slices}" if source.name == "ctpa" else ""))
    out.mkdir(parents=True, exist_ok=True)
    for stale in sorted(out.glob("hospital-*")):  # sites of an earlier run with more sites
        number = stale.name.removeprefix("hospital-")
        if stale.is_dir() and number.isdigit() and int(number) >= sites:
            _prepare_site(stale)  # refuses folders this converter did not write
            stale.rmdir()
    summaries = []
    for k, idx in enumerate(parts):
        if max_per_site is not None and idx.size > max_per_site:
            idx = np.sort(rng.choice(idx, size=max_per_site, replace=False))
        name = f"hospital-{k:02d}"
        if items.fixed_val is not None:
            is_val = items.fixed_val[idx]
            if is_val.all() or not is_val.any():
                raise ValueError(f"{name} got {idx.size} {source.name} items, all from one source file "
                                 "(no training or no validation item); use fewer sites, another seed or scheme")
        else:
            is_val = site_split(labels[idx], rng, val_fraction)
            if source.task == "pe-seg":
                is_val = _with_positive_val(labels[idx], is_val, rng)
        site_dir = out / name
        _prepare_site(site_dir)
        items.write(site_dir, idx, is_val)
        summary = SiteSummary(name, int((~is_val).sum()), int(is_val.sum()), int(labels[idx].sum()))
        _write_source(site_dir, source, args_line, summary, items.note)
        summaries.append(summary)
        log(f"[{k + 1}/{sites}] {name}: {summary.total} items ({summary.train} train, {summary.val} val), "
            f"positive share {summary.positive_share:.2f}")
    return summaries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clients.shared_sites", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True, choices=sorted(TASKS))
    parser.add_argument("--set", dest="dataset", choices=sorted(SETS), default=None,
                        help="shared set of the task (default: " +
                        ", ".join(f"{t} -> {s[0]}" for t, s in TASKS.items()) + ")")
    parser.add_argument("--shared", type=Path, required=True, help="the shared data folder (../shared/data)")
    parser.add_argument("--out", type=Path, required=True, help="folder that receives hospital-00, ...")
    parser.add_argument("--sites", type=int, required=True)
    parser.add_argument("--scheme", choices=SCHEMES, default="iid")
    parser.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration (scheme dirichlet)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-per-site", type=int, default=None, help="cap on items per site (quick runs)")
    parser.add_argument("--val-fraction", type=float, default=0.2)
    parser.add_argument("--block-slices", type=int, default=6, help="slices per study of set ctpa (default 6)")
    args = parser.parse_args(argv)
    try:
        summaries = convert(args.task, args.shared, args.out, args.sites, args.scheme, args.alpha,
                            args.seed, args.max_per_site, args.val_fraction,
                            dataset=args.dataset, block_slices=args.block_slices)
    except (FileNotFoundError, FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    total = sum(s.total for s in summaries)
    dataset = args.dataset or TASKS[args.task][0]
    print(f"Wrote {len(summaries)} sites ({total} items) to {args.out} "
          f"[task {args.task}, set {dataset}, scheme {args.scheme}, seed {args.seed}]")
    print(f"{'site':<12} {'items':>6} {'train':>6} {'val':>5} {'pos.share':>9}")
    for s in summaries:
        print(f"{s.name:<12} {s.total:>6} {s.train:>6} {s.val:>5} {s.positive_share:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
