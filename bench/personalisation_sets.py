"""The data sets and protocol of ``bench/personalisation.py``: sizes, run configs, site folders.

The seed paper's protocol (Xia & Cui, "Personalized federated learning
algorithm based on Reptile", Computer Systems & Applications 2022: a fraction
``r = 0.2`` of the sites per round, ``tau_out = tau_in = 4``, Reptile's meta
step ``alpha = 0.01``, one adaptation step) transposed to three of our sets
(issue 16, item 4) and to the 4 real heart-disease hospitals (issue 34, item
5); the sets' sites are written by the product's own converters
(:mod:`clients.datagen.shared` for the shared real sets,
:class:`clients.datagen.federation.SyntheticFederation` for the PE hospitals).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from clients.training.site_task import TaskSettings
from federation_sites import convert_shared
from server_optimizer_sets import test_view

__all__ = ["SEED_ALPHA", "BenchSet", "Protocol", "SETS", "QUICK", "quick_set", "shortened",
           "sites_per_round", "run_config", "build_sites"]

#: The seed paper's Reptile meta step size (Xia & Cui 2022, its experiments; issue 16).
SEED_ALPHA = 0.01


@dataclass(frozen=True)
class BenchSet:
    """One data set: task, sizes, metrics (the main one first), lr, sites, rounds.

    ``shared_files`` are the ``../shared/data`` files a shared set needs (the set is
    skipped without them) and ``converter_args`` the arguments of the product's
    converter (``python -m clients.datagen shared``) besides ``--sites`` and ``--seed``;
    ``generate_size`` / ``studies`` size the synthetic PE hospitals. ``fraction`` is
    the set's own share of sites a round (0: the protocol's ``r``).

    ``hospitals`` marks a set whose sites are real hospitals with their own splits
    (FLamby's protocol): their number is fixed (``--sites`` and ``--quick`` keep it),
    the converter's split is the fixed one of seed 0 (a run's seed changes the
    initial model, the sampled sites and the batches only) and the metric is read
    on each hospital's held-out ``test`` split (:func:`build_sites`).
    """

    name: str
    task: str
    settings: TaskSettings
    metrics: tuple[str, ...]
    lr: float
    sites: int
    rounds: int
    generate_size: int = 0  # pe-synthetic: in-plane size the hospitals are generated at
    studies: int = 0  # pe-synthetic: studies per hospital (0: the generator's 6-12)
    shared_files: tuple[str, ...] = ()
    converter_args: tuple[str, ...] = ()
    fraction: float = 0.0
    hospitals: bool = False


@dataclass(frozen=True)
class Protocol:
    """The seed paper's sizes: fraction ``r``, ``tau_out = tau_in = tau``, k adaptation steps.

    Reptile's ``alpha`` is not part of it: each alpha measured is its own method variant
    (:func:`personalisation_summary.variant`).
    """

    fraction: float = 0.2
    tau: int = 4
    finetune_steps: int = 1

    def per_round(self, sites: int) -> int:
        """Sites sampled per round, ``max(1, round(r N))``."""
        return max(1, round(self.fraction * sites))

    @property
    def passes(self) -> int:
        """Training passes (examples batches) per sampled site and round: ``tau_out x tau_in``."""
        return self.tau * self.tau


SETS = {
    "pneumoniamnist": BenchSet(
        "pneumoniamnist", "cxr-cls", TaskSettings(image_size=32, batch_size=16),
        ("auc", "accuracy"), 0.05, sites=20, rounds=5,
        shared_files=("cxr2d/pneumoniamnist_balanced.npz",),
        converter_args=("--scheme", "dirichlet", "--alpha", "0.3")),
    "msd-lung": BenchSet(
        "msd-lung", "pe-seg", TaskSettings(image_size=48, slab_slices=1, batch_size=16),
        ("dice",), 0.1, sites=10, rounds=20,
        shared_files=("seg2d/msd_lung_tumour_patches_val.npz",
                      "seg2d/msd_lung_tumour_patches_test.npz"),
        converter_args=("--set", "msd-lung", "--scheme", "size")),
    "pe-synthetic": BenchSet(
        "pe-synthetic", "pe-seg", TaskSettings(image_size=32, slab_slices=9, batch_size=8),
        ("dice",), 0.1, sites=10, rounds=20, generate_size=64, studies=5),
    "heart-disease": BenchSet(
        "heart-disease", "tabular-cls", TaskSettings(batch_size=16), ("accuracy", "auc"),
        0.1, sites=4, rounds=10, shared_files=("tabular/heart_disease/heart_disease_4sites.npz",),
        converter_args=("--set", "heart-disease"), fraction=1.0, hospitals=True),
}
#: The hospitals under partial participation, nearer the seed paper's r: 2 a round, twice
#: the rounds (the same 160 passes a hospital on average).
SETS["heart-disease-r0.5"] = replace(SETS["heart-disease"], name="heart-disease-r0.5",
                                     rounds=20, fraction=0.5)
QUICK = Protocol(tau=2)


def quick_set(bench_set: BenchSet) -> BenchSet:
    """The ``--quick`` wiring check of a set: 2 sites (real hospitals: all), 1 round, small
    hospitals."""
    return shortened(replace(bench_set, generate_size=32, studies=3), sites=2, rounds=1,
                     max_per_site=16)


def shortened(bench_set: BenchSet, sites: int = 0, rounds: int = 0,
              max_per_site: int = 0) -> BenchSet:
    """``bench_set`` with fewer sites or rounds (0: the set's; real hospitals stay all) and at
    most ``max_per_site`` items per site of a shared set (0: all)."""
    capped = ("--max-per-site", str(max_per_site)) if max_per_site and bench_set.shared_files \
        else ()
    kept_sites = bench_set.sites if bench_set.hospitals else sites or bench_set.sites
    return replace(bench_set, sites=kept_sites, rounds=rounds or bench_set.rounds,
                   converter_args=bench_set.converter_args + capped)


def sites_per_round(bench_set: BenchSet, protocol: Protocol) -> int:
    """Sites sampled per round: the protocol's ``max(1, round(r N))``, with the set's own
    ``fraction`` as ``r`` when it has one."""
    fraction = bench_set.fraction or protocol.fraction
    return replace(protocol, fraction=fraction).per_round(bench_set.sites)


def run_config(bench_set: BenchSet, method: str, seed: int, protocol: Protocol,
               alpha: float = SEED_ALPHA) -> dict:
    """The product's run-config overrides of ``method`` (the engine checks them with the
    product's own rules): ``selection.m`` sites per round (:func:`sites_per_round`), plain SGD at the set's lr, the
    seed paper's tau; Per-FedAvg-FO takes half the steps (two batches each) for equal
    local computation."""
    s = bench_set.settings
    steps = protocol.passes // 2 if method == "per-fedavg-fo" else protocol.passes
    return {
        "task": bench_set.task, "optimizer": "sgd", "lr": bench_set.lr, "momentum": 0.0,
        "seed": seed, "local-steps": steps, "image-size": s.image_size,
        "batch-size": s.batch_size, "slab-slices": s.slab_slices,
        "num-server-rounds": bench_set.rounds, "min-nodes": bench_set.sites,
        "selection.m": sites_per_round(bench_set, protocol), "experiment": "personalisation",
        "personalisation.method": method, "personalisation.tau-out": protocol.tau,
        "personalisation.tau-in": protocol.tau, "personalisation.alpha": alpha,
        "personalisation.inner-lr": bench_set.lr,
        "personalisation.finetune-steps": protocol.finetune_steps}


def _pe_profiles(num_sites: int, seed: int, studies: int) -> list:
    """The generator's hospital profiles; with ``studies`` > 0 that many studies of 10-12
    slices each (the noise, contrast and spacing stay the profiles')."""
    from clients.pe_seg.synthetic import site_profiles

    return [p if not studies else replace(p, num_studies=studies, num_slices=(10, 12))
            for p in site_profiles(num_sites, seed)]


def build_sites(bench_set: BenchSet, shared: Path, out: Path, seed: int) -> None:
    """Write the set's site folders for ``seed`` under ``out``.

    A set of real hospitals is converted once with seed 0 (its fixed split) beside ``out``,
    and each hospital's folder under ``out`` is its test view
    (:func:`server_optimizer_sets.test_view`: the same ``train`` rows, its ``test`` rows
    as the ``val`` split its evaluate replies measure, its own ``val`` rows left out).
    """
    if bench_set.hospitals:
        converted = convert_shared(bench_set.task, shared, out.with_name(f"{out.name}-split"), [
            *bench_set.converter_args, "--sites", str(bench_set.sites), "--seed", "0"])
        for folder in converted:
            test_view(folder, out / folder.name)
        return
    if not bench_set.shared_files:
        from clients.datagen.federation import SyntheticFederation
        from clients.pe_seg.synthetic import generate_site

        write = SyntheticFederation(partial(_pe_profiles, studies=bench_set.studies),
                                    generate_site, image_size=bench_set.generate_size)
        write(out, num_sites=bench_set.sites, seed=seed)
        return
    convert_shared(bench_set.task, shared, out, [*bench_set.converter_args, "--sites",
                                                 str(bench_set.sites), "--seed", str(seed)])
