"""The data sets of ``bench/server_optimizers.py`` and the site folders each regime runs on.

Every set is written by the product's converter (``python -m clients.datagen
shared``) from ``../shared/data`` (read only; a set whose file is absent is
skipped):

``heart-disease``
    UCI Heart Disease over its 4 real hospitals (Cleveland, Hungarian,
    Switzerland, VA Long Beach; the source of FLamby's Fed-Heart-Disease),
    horizontal; each hospital keeps its own ``train`` / ``val`` / ``test``
    split (the converter's stratified 60 / 20 / 20, one fixed split: FLamby's
    split is fixed too). The ``tabular-cls`` MLP; metric accuracy at 0.5.
``pneumoniamnist``
    PneumoniaMNIST dealt to 10 sites with a Dirichlet(0.3) label skew (Hsu
    et al. 2019), each site's test items drawn from MedMNIST's own test
    split; the ``cxr-cls`` small DenseNet at 32 px; metric ROC AUC.
``msd-lung``
    The MSD Task06 lung-tumour CT patches dealt to 10 sites with the
    converter's log-normal size skew; the ``pe-seg`` U-Net on 1-slice slabs;
    metric Dice.

**Held-out metric per round.** A site's evaluate reply measures its ``val``
split. To read the held-out ``test`` metric after every round as well, each
site also has a *test view* (:func:`test_view`): a folder with the same
``train`` rows (so a table's scaling, fitted on them, is the same) whose
``val`` rows are the site's ``test`` rows, run under the evaluate-only site
policy. It never trains, so it changes nothing the federation learns; its
evaluate replies are the site's test metric.
"""

from __future__ import annotations

import csv
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from federation_sites import convert_shared, pooled_folder

__all__ = ["BenchSet", "Folders", "SETS", "shortened", "test_view", "build_folders"]

#: Suffix of a site's test view (its site name in the round reports).
TEST_SUFFIX = "-test"


@dataclass(frozen=True)
class BenchSet:
    """One data set: task, metric, task run config, sites, rounds x local steps.

    ``shared_file`` is the ``../shared/data`` file the set needs,
    ``converter_args`` the converter's arguments besides ``--sites`` and ``--seed``, and
    ``lrs`` the sites' learning rates every method tunes over (one rate for the image
    sets: each of their runs costs ~100 s on one CPU core, so only the methods' own knobs
    are tuned there; for the same reason they run 10 rounds: PneumoniaMNIST's validation
    AUC is flat from round ~8, msd-lung's Dice still rises slowly at round 20).
    """

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
    """``bench_set`` with fewer rounds, local steps or sites (0: the set's), at most
    ``max_per_site`` items per site (0: all) and the lr grid ``lrs`` (empty: the set's).
    The heart-disease hospitals stay 4."""
    capped = ("--max-per-site", str(max_per_site)) if max_per_site else ()
    keep_sites = bench_set.name == "heart-disease"
    return replace(bench_set, rounds=rounds or bench_set.rounds, steps=steps or bench_set.steps,
                   sites=bench_set.sites if keep_sites else sites or bench_set.sites,
                   converter_args=bench_set.converter_args + capped,
                   lrs=tuple(lrs) or bench_set.lrs)


@dataclass(frozen=True)
class Folders:
    """The site folders of one set: the sites, their test views (same order) and the pooled
    site holding every site's items."""

    sites: tuple[Path, ...]
    tests: tuple[Path, ...]
    pooled: Path


def _view_rows(index: Path, out: Path) -> None:
    """Copy the index CSV ``index`` to ``out`` without its ``val`` rows, ``test`` rows as
    ``val`` (an index without a ``split`` column is copied as it is)."""
    with index.open(newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = list(reader.fieldnames or []), list(reader)
    if "split" in fields:
        rows = [{**r, "split": "val"} if r["split"] == "test" else r
                for r in rows if r["split"] != "val"]
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def test_view(folder: Path, out: Path) -> Path:
    """The test view of the site folder ``folder`` at ``out`` (see the module docstring):
    its index CSVs rewritten, its data folders hard-linked."""
    out.mkdir(parents=True)
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.suffix == ".csv":
            _view_rows(entry, out / entry.name)
        elif entry.is_dir():
            shutil.copytree(entry, out / entry.name, copy_function=os.link)
    return out


def build_folders(bench_set: BenchSet, shared: Path, out: Path, seed: int = 0) -> Folders:
    """Write the set's sites (converter seed ``seed``), their test views and the pooled site
    under ``out``."""
    sites = convert_shared(bench_set.task, shared, out / "sites", [
        *bench_set.converter_args, "--sites", str(bench_set.sites), "--seed", str(seed)])
    tests = [test_view(s, out / "tests" / f"{s.name}{TEST_SUFFIX}") for s in sites]
    pooled = pooled_folder(sites, out / "pooled" / "pooled")
    return Folders(tuple(sites), tuple(tests), pooled)
