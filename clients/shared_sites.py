"""Turn the shared real data sets into federated site folders the readers understand.

The shared sets (``../shared/data``, see its README) are single arrays; a
federation needs hospitals. This converter splits one set into
``<out>/hospital-00``, ``hospital-01``, ... with :mod:`clients.partitions`
(IID, Dirichlet label skew or log-normal size skew) and writes each site as
real files read through the normal path:

* ``cxr-cls``: ``cxr2d/pneumoniamnist_balanced.npz`` (train + val) -> 28x28
  8-bit PNGs under ``images/`` and ``images.csv`` (:mod:`clients.cxr_manifest`).
  The label is **pneumonia (1) vs normal (0)**, not pneumothorax.
* ``ct3d-cls``: ``ct3d/adrenalmnist3d_64.npz`` (train + val) -> one uint8
  ``(z, y, x)`` ``.npy`` per study under ``volumes/`` and ``labels.csv``
  (:mod:`clients.ct3d_manifest`). The label is the AdrenalMNIST3D label
  (adrenal mass shape), **not** emphysema.

Every site gets its own stratified train/val split and a ``SOURCE.txt`` naming
the data, the meaning of the label and the license (CC BY 4.0, MedMNIST v2).
The output is a function of the arguments (``--seed`` included). Nothing is
ever written inside the shared folder.

Usage::

    python -m clients.shared_sites --task cxr-cls --shared ../shared/data \\
        --out data/shared-cxr-cls-dirichlet-seed0 --sites 4 --scheme dirichlet --alpha 0.5
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clients.ct3d_manifest import LabelEntry, write_label_manifest
from clients.cxr_manifest import CXREntry, format_labels, write_cxr_manifest
from clients.partitions import SCHEMES, partition

__all__ = ["TASKS", "SOURCE_NAME", "SiteSummary", "load_shared", "site_split", "convert", "main"]

SOURCE_NAME = "SOURCE.txt"
_MARKER_LINE = "Written by clients.shared_sites"


@dataclass(frozen=True)
class _TaskSource:
    relpath: str
    prefix: str
    description: str


TASKS: dict[str, _TaskSource] = {
    "cxr-cls": _TaskSource(
        "cxr2d/pneumoniamnist_balanced.npz",
        "pnm",
        "PneumoniaMNIST (MedMNIST v2), 28x28 chest X-rays, class-balanced subsample.\n"
        "Label: 1 = PNEUMONIA, 0 = normal. This is NOT a pneumothorax label: a model\n"
        "trained here detects pneumonia and says nothing about pneumothorax.\n"
        "Cite: Yang et al., MedMNIST v2, Sci Data 2023; Kermany et al., Cell 2018.\n",
    ),
    "ct3d-cls": _TaskSource(
        "ct3d/adrenalmnist3d_64.npz",
        "adr",
        "AdrenalMNIST3D (MedMNIST v2) at 64^3: uint8 {0,255} shape masks from abdominal CT,\n"
        "saved as (z, y, x) uint8 .npy volumes.\n"
        "Label: the AdrenalMNIST3D binary label (adrenal mass shape class), 1 / 0.\n"
        "This is NOT an emphysema label, and the volumes are masks, not lung CT intensities.\n"
        "Cite: Yang et al., MedMNIST v2, Sci Data 2023.\n",
    ),
}


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


def load_shared(task: str, shared: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The train + val images, 0/1 labels and source ids of ``task``'s shared file.

    Raises
    ------
    FileNotFoundError
        If the shared file is absent (the message names it).
    ValueError
        On an unknown task or a file without the expected keys.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {', '.join(TASKS)}")
    source = TASKS[task]
    path = Path(shared) / source.relpath
    if not path.is_file():
        raise FileNotFoundError(
            f"shared data file not found: {path} (expected {source.relpath} under --shared {shared}; "
            "see ../shared/data/README.md)"
        )
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
            ids += [f"{source.prefix}-{split}-{i:05d}" for i in range(len(y))]
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


def _write_source(site_dir: Path, task: str, args_line: str, summary: SiteSummary) -> None:
    source = TASKS[task]
    (site_dir / SOURCE_NAME).write_text(
        f"{_MARKER_LINE} ({args_line}).\n\n"
        f"Task: {task}\nSource file: ../shared/data/{source.relpath} (train + val splits)\n"
        f"{source.description}"
        "License: CC BY 4.0 (MedMNIST v2). Real public data: do not commit it into the repository.\n\n"
        f"This site: {summary.train} train, {summary.val} val, "
        f"{summary.positives} positive ({summary.positive_share:.1%}).\n",
        encoding="utf-8",
    )


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
) -> list[SiteSummary]:
    """Write ``out/hospital-00 ..`` from ``task``'s shared file; returns per-site counts.

    Raises
    ------
    FileNotFoundError
        If the shared file is absent.
    ValueError
        On bad arguments, or if ``out`` lies inside ``shared``.
    FileExistsError
        If a site folder exists that this converter did not write.
    """
    shared, out = Path(shared), Path(out)
    if scheme not in SCHEMES:
        raise ValueError(f"unknown partition scheme {scheme!r}; expected one of {', '.join(SCHEMES)}")
    if max_per_site is not None and max_per_site < 1:
        raise ValueError(f"max_per_site must be >= 1, got {max_per_site}")
    if shared.exists() and _is_inside(out, shared):
        raise ValueError(f"--out {out} lies inside the shared data folder {shared}; never write there")
    images, labels, ids = load_shared(task, shared)
    rng = np.random.default_rng(seed)
    opts = {"alpha": alpha, "min_size": min(10, len(labels) // sites)} if scheme == "dirichlet" else {}
    parts = partition(scheme, labels, sites, rng, **opts)
    args_line = f"task={task} scheme={scheme}" + (f" alpha={alpha}" if scheme == "dirichlet" else "") + \
        f" sites={sites} seed={seed}" + (f" max-per-site={max_per_site}" if max_per_site else "")
    write = _write_cxr_site if task == "cxr-cls" else _write_ct3d_site
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
        is_val = site_split(labels[idx], rng, val_fraction)
        name = f"hospital-{k:02d}"
        site_dir = out / name
        _prepare_site(site_dir)
        write(site_dir, images[idx], labels[idx], [ids[i] for i in idx], is_val)
        summary = SiteSummary(name, int((~is_val).sum()), int(is_val.sum()), int(labels[idx].sum()))
        _write_source(site_dir, task, args_line, summary)
        summaries.append(summary)
        log(f"[{k + 1}/{sites}] {name}: {summary.total} items ({summary.train} train, {summary.val} val), "
            f"positive share {summary.positive_share:.2f}")
    return summaries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clients.shared_sites", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True, choices=sorted(TASKS))
    parser.add_argument("--shared", type=Path, required=True, help="the shared data folder (../shared/data)")
    parser.add_argument("--out", type=Path, required=True, help="folder that receives hospital-00, ...")
    parser.add_argument("--sites", type=int, required=True)
    parser.add_argument("--scheme", choices=SCHEMES, default="iid")
    parser.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration (scheme dirichlet)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-per-site", type=int, default=None, help="cap on items per site (quick runs)")
    parser.add_argument("--val-fraction", type=float, default=0.2)
    args = parser.parse_args(argv)
    try:
        summaries = convert(args.task, args.shared, args.out, args.sites, args.scheme, args.alpha,
                            args.seed, args.max_per_site, args.val_fraction)
    except (FileNotFoundError, FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    total = sum(s.total for s in summaries)
    print(f"Wrote {len(summaries)} sites ({total} items) to {args.out} "
          f"[task {args.task}, scheme {args.scheme}, seed {args.seed}]")
    print(f"{'site':<12} {'items':>6} {'train':>6} {'val':>5} {'pos.share':>9}")
    for s in summaries:
        print(f"{s.name:<12} {s.total:>6} {s.train:>6} {s.val:>5} {s.positive_share:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
