"""The data sets of ``bench/server_optimizers.py`` and the site folders each regime runs on.

Written by ``python -m clients.datagen shared`` from ``../shared/data`` (read only; a set
whose file is absent is skipped): ``heart-disease``, UCI Heart Disease's 4 real hospitals
(FLamby's Fed-Heart-Disease), each its own fixed stratified 60 / 20 / 20 split, the
``tabular-cls`` MLP, accuracy; ``pneumoniamnist`` dealt to 10 sites with a Dirichlet(0.3)
label skew (Hsu et al. 2019), the ``cxr-cls`` DenseNet at 32 px, AUC; ``msd-lung``, MSD
Task06 lung-tumour CT patches dealt to 10 sites with a log-normal size skew, the
``pe-seg`` U-Net on 1-slice slabs, Dice. A site's *test view* (:func:`test_view`: the same
``train`` rows, so a table's scaling is the same, its ``test`` rows as ``val``, under the
evaluate-only site policy) never trains: its evaluate replies are the site's test metric.
"""

from __future__ import annotations

import csv
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from federation_sites import convert_shared, pooled_folder

__all__ = ["BenchSet", "Folders", "SETS", "shortened", "test_view", "build_folders"]


@dataclass(frozen=True)
class BenchSet:
    """A set: task, metric, run config, sites, rounds x steps, its shared file, converter
    arguments and the sites' lrs tuned (image sets: one, ~100 s of CPU a run)."""

    name: str
    task: str
    metric: str
    settings: dict
    sites: int
    rounds: int
    steps: int
    shared_file: str
    converter_args: tuple[str, ...]
    lrs: tuple[float, ...] = (0.03, 0.1, 0.3)


SETS: dict[str, BenchSet] = {
    "heart-disease": BenchSet(
        "heart-disease", "tabular-cls", "accuracy", {"batch-size": 16}, sites=4, rounds=15,
        steps=10, shared_file="tabular/heart_disease/heart_disease_4sites.npz",
        converter_args=("--set", "heart-disease")),
    "pneumoniamnist": BenchSet(
        "pneumoniamnist", "cxr-cls", "auc", {"image-size": 32, "batch-size": 16}, sites=10,
        rounds=10, steps=10, shared_file="cxr2d/pneumoniamnist_balanced.npz",
        converter_args=("--set", "pneumoniamnist", "--scheme", "dirichlet", "--alpha", "0.3"),
        lrs=(0.1,)),
    "msd-lung": BenchSet(
        "msd-lung", "pe-seg", "dice", {"image-size": 48, "slab-slices": 1, "batch-size": 16},
        sites=10, rounds=10, steps=10, shared_file="seg2d/msd_lung_tumour_patches_val.npz",
        converter_args=("--set", "msd-lung", "--scheme", "size"), lrs=(0.1,)),
}


def shortened(bench_set: BenchSet, rounds: int = 0, steps: int = 0, sites: int = 0,
              max_per_site: int = 0, lrs: tuple[float, ...] = ()) -> BenchSet:
    """``bench_set`` with other rounds, local steps, sites (the 4 hospitals stay), items per
    site or lr grid (0 or empty: the set's)."""
    capped = ("--max-per-site", str(max_per_site)) if max_per_site else ()
    return replace(bench_set, rounds=rounds or bench_set.rounds, steps=steps or bench_set.steps,
                   sites=bench_set.sites if bench_set.name == "heart-disease" else
                   sites or bench_set.sites, converter_args=bench_set.converter_args + capped,
                   lrs=tuple(lrs) or bench_set.lrs)


@dataclass(frozen=True)
class Folders:
    """A set's site folders, their test views (same order) and the pooled site."""

    sites: tuple[Path, ...]
    tests: tuple[Path, ...]
    pooled: Path


def test_view(folder: Path, out: Path) -> Path:
    """The test view of the site folder ``folder`` at ``out`` (see the module docstring): its
    index CSVs without ``val`` rows and with ``test`` rows as ``val``, its data hard-linked."""
    out.mkdir(parents=True)
    for entry in (e for e in sorted(folder.iterdir()) if not e.name.startswith(".")):
        if entry.suffix == ".csv":
            with entry.open(newline="") as f:
                reader = csv.DictReader(f)
                fields, rows = list(reader.fieldnames or []), list(reader)
            if "split" in fields:
                rows = [{**r, "split": "val"} if r["split"] == "test" else r
                        for r in rows if r["split"] != "val"]
            with (out / entry.name).open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=fields)
                writer.writeheader()
                writer.writerows(rows)
        elif entry.is_dir():
            shutil.copytree(entry, out / entry.name, copy_function=os.link)
    return out


def build_folders(bench_set: BenchSet, shared: Path, out: Path, seed: int = 0) -> Folders:
    """The set's sites (converter seed ``seed``), their test views and the pooled site, under
    ``out``."""
    sites = convert_shared(bench_set.task, shared, out / "sites", [
        *bench_set.converter_args, "--sites", str(bench_set.sites), "--seed", str(seed)])
    tests = tuple(test_view(s, out / "tests" / f"{s.name}-test") for s in sites)
    return Folders(tuple(sites), tests, pooled_folder(sites, out / "pooled" / "pooled"))
