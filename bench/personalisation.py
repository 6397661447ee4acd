"""Personalised FL on our data: Per-FedAvg-Reptile vs its peers, per-site metric over seeds.

The seed paper's protocol (Xia & Cui, "Personalized federated learning
algorithm based on Reptile", Computer Systems & Applications 2022: a fraction
``r = 0.2`` of the sites per round, ``tau_out = tau_in = 4``, Reptile's
``alpha = 0.01``, each site's model adapted one step from the learned
initialisation, mean +- sd over runs) on our sets (:data:`SETS`; issue 16, item
4; issue 34, item 5: the 4 real heart-disease hospitals, all training every
round). Each method is a run config of the product (``personalisation.*``,
:func:`run_config`) run by the in-process engine (:func:`engine_runs.run_product`:
the real ServerApp and ClientApp, the uniform selector's ``selection.m =
max(1, round(r N))`` sites a round, the default norm-bound defence, the site
policy); in the last round every site evaluates the global model (``val-<metric>``)
and its personalised one (``personalised-val-<metric>``) on its ``val`` split
(hospitals: their ``test`` rows). Methods (``method`` of the JSON):
``fedavg-global``, ``finetune`` (the same run, then 1 SGD step at each site),
``per-fedavg-reptile`` (a row per ``--alphas`` value), ``per-fedavg-fo``,
``fedbn`` (refused by the product for a model without normalisation state:
skipped) and ``local-only``, all with **equal local computation** (16 training
passes per sampled site and round, plain SGD; local only spreads the
federation's total over the sites). A seed fixes the split, the initial model,
the sampled sites and every batch. docs/BENCHMARKS.md describes the sets.

``local-only`` is the one arm that is not a federation of the product: each site
alone is a federation of that one site, one round from the same initial weights
(no run config has N sites train without sharing). The study keeps its own loop
rather than ``bench/runner.py``'s: an arm depends on the set (``fedbn``), one arm
is N federations, ``--seeds`` is a count, and the JSON keeps the sets a run does
not measure (:mod:`personalisation_summary`). Writes ``--output`` after every seed::

    python bench/personalisation.py [--seeds 5] [--sets msd-lung] [--alphas 0.01 0.5] [--resume]
    python bench/personalisation.py --sets pneumoniamnist --sites 5 --rounds 4 --seeds 1
    python bench/personalisation.py --quick   # wiring check: 2 tiny sites, 1 round
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import BENCH  # noqa: I001

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from dataclasses import asdict, dataclass, replace  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402

from clients.training.site_task import TaskSettings  # noqa: E402
from engine_runs import SHARED, run_product  # noqa: E402
from federation_sites import convert_shared, folder_sites, site_evaluations, train_totals  # noqa: E402
from personalisation_summary import (METHODS, REPTILE, kept_sets, print_rows,  # noqa: E402
                                     seed_record, split_variant, summarise, variant, variants)
from report import environment, write_report  # noqa: E402
from server_optimizer_sets import test_view  # noqa: E402
from strategies.wire.errors import ConfigError  # noqa: E402

__all__ = ["SEED_ALPHA", "BenchSet", "Protocol", "SETS", "QUICK", "shortened", "quick_set",
           "sites_per_round", "run_config", "build_sites", "protocol_record", "run_seed", "main"]

#: The seed paper's Reptile meta step size (Xia & Cui 2022, its experiments; issue 16).
SEED_ALPHA = 0.01
#: What the product's evaluate reply calls a personalised model's metric.
PERSONALISED = "personalised-val-"


@dataclass(frozen=True)
class BenchSet:
    """One set: task, sizes, metrics (the main one first), lr, sites, rounds; the
    ``../shared/data`` files it needs and the product converter's arguments (besides
    ``--sites``, ``--seed``); the synthetic PE hospitals' size; its own share of sites a
    round (0: the protocol's ``r``); ``hospitals``: real hospitals, their number and
    split (the converter's of seed 0) fixed, each measured on its ``test`` split."""

    name: str
    task: str
    settings: TaskSettings
    metrics: tuple[str, ...]
    lr: float
    sites: int
    rounds: int
    generate_size: int = 0
    studies: int = 0
    shared_files: tuple[str, ...] = ()
    converter_args: tuple[str, ...] = ()
    fraction: float = 0.0
    hospitals: bool = False


@dataclass(frozen=True)
class Protocol:
    """The seed paper's sizes: fraction ``r``, ``tau_out = tau_in = tau``, k adaptation steps."""

    fraction: float = 0.2
    tau: int = 4
    finetune_steps: int = 1

    @property
    def passes(self) -> int:
        """Training passes (batches) per sampled site and round: ``tau_out x tau_in``."""
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
#: The hospitals nearer the seed paper's r: 2 a round, twice the rounds (the same passes).
SETS["heart-disease-r0.5"] = replace(SETS["heart-disease"], name="heart-disease-r0.5",
                                     rounds=20, fraction=0.5)
QUICK = Protocol(tau=2)
#: The federations: run config ``personalisation.method`` -> the methods it measures.
TRAINED = {"finetune": ("fedavg-global", "finetune"), REPTILE: (REPTILE,),
           "per-fedavg-fo": ("per-fedavg-fo",), "fedbn": ("fedbn",)}


def shortened(bench_set: BenchSet, sites: int = 0, rounds: int = 0,
              max_per_site: int = 0) -> BenchSet:
    """``bench_set`` with fewer sites or rounds (0: the set's; real hospitals stay all) and at
    most ``max_per_site`` items per site of a shared set (0: all)."""
    capped = ("--max-per-site", str(max_per_site)) if max_per_site and bench_set.shared_files \
        else ()
    return replace(bench_set, sites=bench_set.sites if bench_set.hospitals else
                   sites or bench_set.sites, rounds=rounds or bench_set.rounds,
                   converter_args=bench_set.converter_args + capped)


def quick_set(bench_set: BenchSet) -> BenchSet:
    """The ``--quick`` wiring check of a set: 2 sites (hospitals: all), 1 round, small ones."""
    return shortened(replace(bench_set, generate_size=32, studies=3), 2, 1, 16)


def sites_per_round(bench_set: BenchSet, protocol: Protocol) -> int:
    """``max(1, round(r N))``, ``r`` the set's own ``fraction`` when it has one."""
    return max(1, round((bench_set.fraction or protocol.fraction) * bench_set.sites))


def run_config(bench_set: BenchSet, method: str, seed: int, protocol: Protocol,
               alpha: float = SEED_ALPHA) -> dict:
    """The product's run config of ``method``: ``selection.m`` sites a round, plain SGD at the
    set's lr, the seed paper's tau; Per-FedAvg-FO half the steps (two batches each)."""
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
    """The generator's hospital profiles; with ``studies`` > 0 that many of 10-12 slices."""
    from clients.pe_seg.synthetic import site_profiles

    return [p if not studies else replace(p, num_studies=studies, num_slices=(10, 12))
            for p in site_profiles(num_sites, seed)]


def build_sites(bench_set: BenchSet, shared: Path, out: Path, seed: int) -> None:
    """Write the set's site folders for ``seed`` under ``out``. Real hospitals are converted
    once with seed 0 beside ``out``; each one's folder under ``out`` is its
    :func:`server_optimizer_sets.test_view` (its ``test`` rows as the ``val`` it measures)."""
    if bench_set.hospitals:
        converted = convert_shared(bench_set.task, shared, out.with_name(f"{out.name}-split"), [
            *bench_set.converter_args, "--sites", str(bench_set.sites), "--seed", "0"])
        for folder in converted:
            test_view(folder, out / folder.name)
    elif not bench_set.shared_files:
        from clients.datagen.federation import SyntheticFederation
        from clients.pe_seg.synthetic import generate_site

        SyntheticFederation(partial(_pe_profiles, studies=bench_set.studies), generate_site,
                            image_size=bench_set.generate_size)(
            out, num_sites=bench_set.sites, seed=seed)
    else:
        convert_shared(bench_set.task, shared, out, [*bench_set.converter_args, "--sites",
                                                     str(bench_set.sites), "--seed", str(seed)])


def _metrics(values: dict[str, float], prefix: str) -> dict[str, float]:
    return {k[len(prefix):]: v for k, v in values.items()
            if k.startswith(prefix) and not k.endswith("-loss")}


def federated(folders: list[Path], config: dict, workdir: Path) -> dict:
    """One federation of the product: each site's last-round metrics of the global and the
    personalised model (none, e.g. a FedBN site never sampled: the global one's), the
    training passes (a Per-FedAvg-FO step takes two batches), the sites of each round.
    Raises :class:`~strategies.wire.errors.ConfigError` where the product refuses ``config``."""
    outcome, seconds = run_product(config, folder_sites(folders), workdir)
    evaluated = sorted(site_evaluations(outcome).items())
    passes = int(sum(t["steps"] for t in train_totals(outcome).values())) * (
        2 if config["personalisation.method"] == "per-fedavg-fo" else 1)
    return {"global": {s: _metrics(v, "val-") for s, v in evaluated},
            "personal": {s: _metrics(v, PERSONALISED) or _metrics(v, "val-")
                         for s, v in evaluated},
            "fallback": [s for s, v in evaluated if not _metrics(v, PERSONALISED)],
            "passes": passes, "examples": passes * config["batch-size"], "seconds": seconds,
            "sampled": [sorted(outcome.reports[r].train) for r in sorted(outcome.reports)]}


def local_only(folders: list[Path], config: dict, steps: int, workdir: Path) -> dict:
    """Each site alone: a federation of that one site, one round of ``steps`` steps from the
    federation's initial weights, measured on its own ``val`` split."""
    alone = {**config, "personalisation.method": "none", "num-server-rounds": 1,
             "local-steps": steps, "min-nodes": 1, "selection.m": 0}
    runs = [federated([folder], alone, workdir) for folder in folders]
    return {"global": {f.name: {} for f in folders},
            "personal": {f.name: r["global"][f.name] for f, r in zip(folders, runs)},
            "fallback": [], **{k: sum(r[k] for r in runs) for k in ("passes", "examples",
                                                                     "seconds")},
            "sampled": [[f.name] for f in folders]}


def run_seed(bench_set: BenchSet, folders: list[Path], seed: int, protocol: Protocol,
             wanted: list[str], alphas: tuple[float, ...], workdir: Path) -> dict:
    """The variants in ``wanted`` on the sites ``folders`` with ``seed``: ``{variant:
    per-seed record}`` (fedbn absent when the product refuses it for the task's model)."""
    out: dict[str, dict] = {}
    for name, methods in TRAINED.items():
        for alpha in alphas if name == REPTILE else (SEED_ALPHA,):
            keys = [variant(m, alpha) for m in methods]
            if not set(keys) & set(wanted):
                continue
            try:
                result = federated(folders, run_config(bench_set, name, seed, protocol, alpha),
                                   workdir)
            except ConfigError as exc:  # the product refuses FedBN for a model without BN
                print(f"{bench_set.name} {name}: refused by the product ({exc})", flush=True)
                continue
            for key in keys:  # fedavg-global: the finetune run's global model
                out[key] = seed_record(result if key != "fedavg-global" else {
                    **result, "personal": result["global"], "fallback": []}, bench_set.metrics)
    if "local-only" in wanted:
        steps, rest = divmod(bench_set.rounds * sites_per_round(bench_set, protocol)
                             * protocol.passes, len(folders))
        if rest:
            raise ValueError(f"set {bench_set.name}: rounds x sites per round x "
                             f"{protocol.passes} passes is not a multiple of the "
                             f"{len(folders)} sites (local only)")
        out["local-only"] = seed_record(local_only(folders, run_config(
            bench_set, "finetune", seed, protocol), steps, workdir), bench_set.metrics)
    return out


def protocol_record(protocol: Protocol, quick: bool) -> dict:
    """The JSON's ``protocol``: what every set of one output file shares."""
    return {**asdict(protocol), "passes_per_site_round": protocol.passes, "optimizer": "sgd",
            "momentum": 0.0, "quick": quick}


def _measure(bench_set: BenchSet, payload: dict, args: argparse.Namespace, protocol: Protocol,
             tmp: Path) -> None:
    """Every seed of ``bench_set`` missing a wanted variant; the output after each seed."""
    wanted = [v for v in variants(tuple(args.alphas)) if split_variant(v)[0] in args.methods]
    records = payload["per_seed"].setdefault(bench_set.name, [])
    for seed in range(args.seeds):
        record = next((r for r in records if r["seed"] == seed), None)
        if record is None:
            record = {"seed": seed, "methods": {}}
            records.append(record)
        missing = [k for k in wanted if k not in record["methods"]]
        if record["methods"] and not [k for k in missing if k != "fedbn"]:
            continue  # complete (a measured seed without fedbn: the product refused it)
        root = tmp / f"{bench_set.name}-seed{seed}"
        build_sites(bench_set, args.shared, root / "sites", seed)
        folders = sorted(p for p in (root / "sites").iterdir() if p.is_dir())
        record["methods"].update(run_seed(bench_set, folders, seed, protocol, missing,
                                          tuple(args.alphas), root / "runs"))
        records.sort(key=lambda r: r["seed"])
        payload["runs"] = [r for r in payload["runs"] if r["set"] != bench_set.name]
        payload["runs"] += summarise(bench_set.name, bench_set.metrics, records)
        write_report(args.output, payload, allow_nan=False)
        print(f"{bench_set.name} seed {seed} done", flush=True)
    if records and "fedbn" not in records[0]["methods"]:
        payload["skipped"].append({"set": bench_set.name, "method": "fedbn", "reason": (
            f"{bench_set.task}'s model has no normalisation layers with parameters or "
            "statistics (the product refuses fedbn for it)")})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", type=Path, default=SHARED)
    p.add_argument("--sets", nargs="+", default=list(SETS), choices=sorted(SETS))
    p.add_argument("--seeds", type=int, default=5, help="seeds 0 .. seeds-1")
    p.add_argument("--alphas", type=float, nargs="+", default=[SEED_ALPHA],
                   help="Reptile meta step sizes, one per-fedavg-reptile row each")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS,
                   help="the methods measured (fedavg-global comes with finetune's run)")
    p.add_argument("--sites", type=int, default=0, help="fewer sites than the set's (0: its)")
    p.add_argument("--rounds", type=int, default=0, help="fewer rounds than the set's (0: its)")
    p.add_argument("--max-per-site", type=int, default=0,
                   help="at most this many items per site of a shared set (0: all)")
    p.add_argument("--quick", action="store_true",
                   help="wiring check: 2 tiny sites, 1 round of tau 2 x 2, 1 seed")
    p.add_argument("--output", type=Path, default=BENCH / "results" / "personalisation.json")
    p.add_argument("--resume", action="store_true",
                   help="keep the seeds and methods --output holds for the same set settings")
    args = p.parse_args(argv)
    protocol = QUICK if args.quick else Protocol()
    sets = [shortened(SETS[name], args.sites, args.rounds, args.max_per_site)
            for name in args.sets]
    if args.quick:
        args.seeds, sets = 1, [quick_set(s) for s in sets]
    payload: dict = {
        "description": "personalised FL (issues 16, 34): per-site val metric (a set of real "
                       "hospitals: test metric) after the last round, "
                       "mean +- sd over seeds; equal local computation",
        "protocol": protocol_record(protocol, args.quick),
        "sets": {s.name: json.loads(json.dumps({**asdict(s), "engine": "in-process"}))
                 for s in sets}, "runs": [], "skipped": [], "per_seed": {},
        "commands": [" ".join(["python", "bench/personalisation.py", *(argv or sys.argv[1:])])],
        "engine": "in-process",
        "machine": {**environment(), "platform": platform.platform(),
                    "processor": platform.processor(), "device": "cpu"},
    }
    kept = json.loads(args.output.read_text()) if args.output.is_file() else {}
    kept_sets(kept, payload, args.sets, args.resume, args.output)
    with tempfile.TemporaryDirectory(prefix="personalisation-") as tmp:
        for bench_set in sets:
            absent = [f for f in bench_set.shared_files if not (args.shared / f).is_file()]
            if absent:
                payload["skipped"].append({"set": bench_set.name, "reason": f"no "
                                           f"{args.shared / absent[0]} (shared data absent)"})
                print(f"skipped {bench_set.name}: shared data absent", flush=True)
                continue
            _measure(bench_set, payload, args, protocol, Path(tmp))
    write_report(args.output, payload, allow_nan=False)
    print_rows(payload["runs"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
