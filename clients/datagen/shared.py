"""Turn the shared real data sets into federated site folders the readers understand.

The shared sets (``../shared/data``, see its README) are single arrays or
volumes; a federation needs hospitals. This converter splits one set into
``<out>/hospital-00``, ``hospital-01``, ... with :mod:`clients.datagen.partitions`
(IID, Dirichlet label skew or log-normal size skew) and writes each site as
real files read through the normal path. The sets are declared by their tasks
and listed in :data:`clients.registry.TASKS` (the first of a task is its default):

* ``cxr-cls``: ``pneumoniamnist`` (:mod:`clients.cxr_cls.shared`);
* ``ct3d-cls``: ``adrenalmnist3d`` (:mod:`clients.ct3d_cls.shared`);
* ``pe-seg``: ``ctpa`` and ``msd-lung`` (:mod:`clients.pe_seg.shared`);
* ``tabular-cls``: ``heart-disease`` (:mod:`clients.tabular.shared`: its own 4 hospitals are
  the sites, ``--sites 4``, whatever the scheme).

Every site gets a train/val split (stratified by label for the classification
sets and ``ctpa``; fixed by source file for ``msd-lung``), a held-out ``test``
split (``--test-fraction``; from the source's own test split where it has one,
a seeded share otherwise: :mod:`clients.datagen.held_out`) and a ``SOURCE.txt``
naming the data, the meaning of the label and the license. The output is a
function of the arguments (``--seed`` included). Nothing is ever written
inside the shared folder, and a site folder this converter did not write is
never overwritten.

Usage::

    python -m clients.datagen shared --task cxr-cls --shared ../shared/data \\
        --out data/shared-cxr-cls-dirichlet0.5-seed0 --sites 4 --scheme dirichlet --alpha 0.5
    python -m clients.datagen shared --task pe-seg --set msd-lung --shared ../shared/data \\
        --out data/shared-pe-seg-msd-lung-iid-seed0 --sites 3
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clients.datagen.federation import hospital_name
from clients.datagen.held_out import HeldOutPool, held_out_rng, move_share, splits_of
from clients.datagen.partitions import SCHEMES, partition, stratified_iid_partition
from clients.datagen.shared_set import SharedSet, own_hospitals, read_medmnist, source_path
from clients.errors import StudyError
from clients.registry import TASKS, shared_set

__all__ = ["SOURCE_NAME", "SiteSummary", "load_shared", "site_split", "convert", "main"]

SOURCE_NAME = "SOURCE.txt"
#: First words of every SOURCE.txt this converter writes (kept from its first name: it
#: identifies the folders earlier versions wrote, and the output stays byte-identical).
_MARKER_LINE = "Written by clients.shared_sites"


@dataclass(frozen=True)
class SiteSummary:
    """What one written site holds (counts only)."""

    name: str
    train: int
    val: int
    positives: int
    test: int = 0

    @property
    def total(self) -> int:
        """Items in all three splits."""
        return self.train + self.val + self.test

    @property
    def positive_share(self) -> float:
        """Share of positive items (0 for an empty site)."""
        return self.positives / self.total if self.total else 0.0


def load_shared(task: str, shared: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The train + val images, 0/1 labels and source ids of a classification task's shared file.

    Raises
    ------
    FileNotFoundError
        If the shared file is absent (the message names it).
    ValueError
        On an unknown or non-classification task, or a file without the expected keys.
    """
    source = shared_set(task)
    if source.task not in ("cxr-cls", "ct3d-cls"):
        raise ValueError(f"load_shared reads the classification sets; {task!r} is a segmentation task")
    prefix = {"pneumoniamnist": "pnm", "adrenalmnist3d": "adr"}[source.name]
    return read_medmnist(source_path(shared, source.files[0]), prefix)


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
            raise FileExistsError(f"{site_dir} exists and was not written by clients.datagen.shared; refusing to overwrite")
        shutil.rmtree(site_dir)
    site_dir.mkdir(parents=True)


def _write_source(site_dir: Path, source: SharedSet, args_line: str, summary: SiteSummary, note: str) -> None:
    files = " + ".join(f"../shared/data/{f}" for f in source.files)
    what = "studies with a non-empty mask" if source.task == "pe-seg" else "positive"
    (site_dir / SOURCE_NAME).write_text(
        f"{_MARKER_LINE} ({args_line}).\n\n"
        f"Task: {source.task}\nSet: {source.name}\nSource file(s): {files}"
        + (" (train + val splits; its test split feeds the sites' test splits)"
           if source.task in ("cxr-cls", "ct3d-cls") else "") + "\n"
        f"{source.description}{note}"
        f"{source.license}\n"
        f"This site: {summary.train} train, {summary.val} val, {summary.test} test, "
        f"{summary.positives} {what} ({summary.positive_share:.1%}).\n",
        encoding="utf-8",
    )


def convert(task: str, shared: Path, out: Path, sites: int, scheme: str = "iid", alpha: float = 0.5,
            seed: int = 0, max_per_site: int | None = None, val_fraction: float = 0.2, log=print,
            test_fraction: float = 0.2, *, dataset: str | None = None,
            block_slices: int = 6) -> list[SiteSummary]:
    """Write ``out/hospital-00 ..`` from a shared set of ``task``; returns per-site counts.

    ``dataset`` picks the set (default: the task's first, see :data:`TASKS`);
    ``block_slices`` is the study depth of the ``ctpa`` set. Items are
    partitioned by ``scheme`` on their 0/1 label (the class for the
    classification sets, "has a non-empty mask" for the segmentation sets).
    For the segmentation sets ``iid`` is stratified by that label
    (:func:`clients.datagen.partitions.stratified_iid_partition`) and ``size`` gives
    every site at least ``min(10, n // sites)`` (>= 2) studies, so that every
    site has a training and a validation study. ``test_fraction`` sizes each
    site's held-out ``test`` split (:mod:`clients.datagen.held_out`; 0: none).

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
    source = shared_set(task, dataset)
    if scheme not in SCHEMES:
        raise ValueError(f"unknown partition scheme {scheme!r}; expected one of {', '.join(SCHEMES)}")
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    if max_per_site is not None and max_per_site < 1:
        raise ValueError(f"max_per_site must be >= 1, got {max_per_site}")
    if shared.exists() and _is_inside(out, shared):
        raise ValueError(f"--out {out} lies inside the shared data folder {shared}; never write there")
    items = source.load_items(source, shared, block_slices)
    labels = items.partitioned
    rng = np.random.default_rng(seed)
    if items.hospitals is not None:  # a set of real hospitals: they are the sites
        parts = own_hospitals(items.hospitals, sites, source.name)
    elif source.task == "pe-seg" and scheme == "iid":
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
    test_draws = held_out_rng(seed)
    pool = HeldOutPool(items.held_out, test_draws) if items.held_out is not None else None
    for k, idx in enumerate(parts):
        if max_per_site is not None and idx.size > max_per_site:
            idx = np.sort(rng.choice(idx, size=max_per_site, replace=False))
        name = hospital_name(k)
        if items.fixed_val is not None:
            is_val = items.fixed_val[idx]
            if is_val.all() or not is_val.any():
                raise ValueError(f"{name} got {idx.size} {source.name} items, all from one source file "
                                 "(no training or no validation item); use fewer sites, another seed or scheme")
        else:
            is_val = site_split(labels[idx], rng, val_fraction)
            if source.task == "pe-seg":
                is_val = _with_positive_val(labels[idx], is_val, rng)
        splits = splits_of(is_val)
        if pool is not None:  # the source's own test items, never partitioned
            extra = pool.take(idx.size, test_fraction)
            idx, splits = np.concatenate([idx, extra]), np.concatenate([splits, ["test"] * extra.size])
        else:  # msd-lung: from the other patients' (val) items; ctpa: from the training items
            splits = move_share(splits, "val" if items.fixed_val is not None else "train",
                                test_fraction, test_draws)
        site_dir = out / name
        _prepare_site(site_dir)
        items.write(site_dir, idx, splits)
        summary = SiteSummary(name, int((splits == "train").sum()), int((splits == "val").sum()),
                              int(items.labels[idx].sum()), int((splits == "test").sum()))
        _write_source(site_dir, source, args_line, summary, items.note)
        summaries.append(summary)
        log(f"[{k + 1}/{sites}] {name}: {summary.total} items ({summary.train} train, {summary.val} val, "
            f"{summary.test} test), "
            f"positive share {summary.positive_share:.2f}")
    return summaries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clients.datagen shared", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True, choices=sorted(TASKS))
    parser.add_argument("--set", dest="dataset", default=None,
                        choices=sorted(name for entry in TASKS.entries().values()
                                       for name in entry.shared_sets),
                        help="shared set of the task (default: " +
                        ", ".join(f"{t} -> {e.shared_sets[0]}" for t, e in TASKS.entries().items()
                                  if e.shared_sets) + ")")
    parser.add_argument("--shared", type=Path, required=True, help="the shared data folder (../shared/data)")
    parser.add_argument("--out", type=Path, required=True, help="folder that receives hospital-00, ...")
    parser.add_argument("--sites", type=int, required=True)
    parser.add_argument("--scheme", choices=SCHEMES, default="iid")
    parser.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration (scheme dirichlet)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-per-site", type=int, default=None, help="cap on items per site (quick runs)")
    parser.add_argument("--val-fraction", type=float, default=0.2)
    parser.add_argument("--test-fraction", type=float, default=0.2,
                        help="held-out test share per site (from the source's test split where it has one)")
    parser.add_argument("--block-slices", type=int, default=6, help="slices per study of set ctpa (default 6)")
    args = parser.parse_args(argv)
    try:
        summaries = convert(args.task, args.shared, args.out, args.sites, args.scheme, args.alpha,
                            args.seed, args.max_per_site, args.val_fraction,
                            dataset=args.dataset, block_slices=args.block_slices,
                            test_fraction=args.test_fraction)
    except (FileNotFoundError, FileExistsError, ValueError, StudyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    total = sum(s.total for s in summaries)
    dataset = args.dataset or TASKS.get(args.task).default_set(args.task)
    print(f"Wrote {len(summaries)} sites ({total} items) to {args.out} "
          f"[task {args.task}, set {dataset}, scheme {args.scheme}, seed {args.seed}]")
    print(f"{'site':<12} {'items':>6} {'train':>6} {'val':>5} {'test':>5} {'pos.share':>9}")
    for s in summaries:
        print(f"{s.name:<12} {s.total:>6} {s.train:>6} {s.val:>5} {s.test:>5} {s.positive_share:>9.2f}")
    return 0

