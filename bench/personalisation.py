"""Personalised FL on our data: Per-FedAvg-Reptile vs its peers, per-site metric over seeds.

The seed paper's protocol (Xia & Cui, "Personalized federated learning
algorithm based on Reptile", Computer Systems & Applications 2022: a fraction
``r = 0.2`` of the sites per round, ``tau_out = tau_in = 4``, Reptile's
``alpha = 0.01``, each site's model adapted one step from the learned
initialisation, mean +- sd over runs) transposed to our data (issue 16, item
4). Each method is a run config of the product (``personalisation.*`` keys)
run by the in-process engine (``bench/personalisation_rounds.py``: the real
ServerApp and ClientApp, the default norm-bound defence, the site policy),
CPU. The sets (``bench/personalisation_sets.py``; ``--sites``, ``--rounds`` and
``--max-per-site`` shorten them):

- ``pneumoniamnist``: PneumoniaMNIST (28 px read at 32: the run config wants a
  multiple of 8; ``../shared/data/cxr2d``, skipped when absent) cut by the
  product's converter into 20 sites with a Dirichlet(0.3) label skew (Hsu et
  al. 2019), 5 rounds (each site trains about once: what the shared CPU
  allowed), the small DenseNet (BatchNorm); metric ROC AUC (accuracy at 0.5
  too) on each site's ``val`` split, which has the site's own label mix. AUC is
  left out at a site whose ``val`` holds one class only;
- ``msd-lung``: the 130 + 130 MSD Task06 lung-tumour CT patches (48 px, manual
  masks; ``../shared/data/seg2d``, skipped when absent) cut by the product's
  converter into 10 sites with its log-normal size skew (``--scheme size``:
  ``exp(N(0, 1))`` shares over a floor of 10 patches per site); each site
  trains on its patches of the ``val`` file and is measured on its patches of
  the ``test`` file (other patients; a fifth of the site's patches are its
  held-out ``test`` split, not used here). 20 rounds, the product's U-Net at
  slab 1 (2D); metric Dice;
- ``pe-synthetic``: 10 synthetic PE hospitals of the product's generator
  (:func:`clients.pe_seg.synthetic.site_profiles`: they differ in scanner noise,
  contrast enhancement and slice spacing; 5 studies of 10-12 slices each here, to fit
  the CPU), generated at 64 px, trained at 32 px, 20 rounds, the 2.5D U-Net;
  metric Dice;
- ``heart-disease``: UCI Heart Disease's 4 real hospitals (``../shared/data/tabular``,
  skipped when absent; FLamby's Fed-Heart-Disease), each with the converter's fixed
  train / val / test split (seed 0), the ``tabular-cls`` MLP, batch 16, metric
  accuracy (main) and ROC AUC on each hospital's held-out ``test`` split (left out at a
  hospital whose test split holds one class). **All 4 hospitals train every round**
  (the set's ``fraction`` 1): ``r = 0.2`` of 4 would be one hospital a round, so the
  "global" model would follow whichever hospital trained last (their label mixes
  range from 36% to 93% positive), and a cross-silo federation of 4 hospitals has
  them all every round, as FLamby does. lr 0.1: FedAvg's choice on the hospitals'
  ``val`` splits in ``bench/server_optimizers.py``'s tuning (grid 0.03 / 0.1 / 0.3).
  10 rounds of 16 passes: 160 SGD steps a hospital, next to that benchmark's 15 x 10;
- ``heart-disease-r0.5``: the same hospitals, 2 of them a round (``r = 0.5``), 20 rounds.

The U-Net's InstanceNorm has neither parameters nor statistics, so ``fedbn`` is
refused on both segmentation sets (the product's own check when the federation
starts) and skipped; so is it on ``heart-disease`` (the MLP has no normalisation layer).

Methods (``method`` of the JSON): ``fedavg-global`` (FedAvg's global model, no
adaptation), ``finetune`` (the same FedAvg run, then ``finetune-steps`` = 1 SGD
step at each site: "FedAvg with one update"), ``per-fedavg-reptile`` (one row
per ``--alphas`` value, its ``alpha`` in the row: default the seed paper's 0.01;
the runs before 2026-11-24 used the product's default 0.5), ``per-fedavg-fo``
(inner-lr = lr, so its one adaptation step is the same size as fine-tuning's),
``fedbn`` and ``local-only`` (each site alone). **Equal local computation**:
every method runs the same number of forward/backward passes of a training
batch in all: 16 passes per sampled site and round (Reptile 4 x 4 SGD steps;
FedAvg and FedBN 16 steps; Per-FedAvg-FO 8 steps of two batches each), and local
only spreads the federation's total evenly over the sites. All use plain SGD
(no momentum) at the set's lr. A seed (the product's ``seed`` key) fixes the data
split or hospitals, the initial model, the sampled sites (``selection.m`` of the
product's uniform selector) and every batch (the product's per-site seeds).

The summary (``bench/personalisation_summary.py``) averages the per-site metric
over the sites (unweighted); ``mean`` / ``sd`` are over seeds, and
``gain_vs_fedavg_global`` is the paired per-seed difference to ``fedavg-global``.
Writes ``--output`` (default ``bench/results/personalisation.json``) after every
seed, keeping the sets it does not measure::

    python bench/personalisation.py [--seeds 5] [--sets msd-lung] [--alphas 0.01 0.5] [--resume]
    python bench/personalisation.py --sets pneumoniamnist --sites 5 --rounds 4 --seeds 1
    python bench/personalisation.py --quick   # wiring check: 2 tiny sites, 1 round
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import ROOT  # noqa: I001

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import asdict, replace  # noqa: E402
from pathlib import Path  # noqa: E402

from personalisation_rounds import federated_outcomes, local_only  # noqa: E402
from personalisation_sets import (QUICK, SEED_ALPHA, SETS, BenchSet, Protocol,  # noqa: E402
                                  build_sites, quick_set, run_config, shortened,
                                  sites_per_round)
from personalisation_summary import (METHODS, REPTILE, kept_sets, seed_record,  # noqa: E402
                                     split_variant, summarise, variant, variants)
from report import Column, environment, print_table, write_report  # noqa: E402
from stats import pm  # noqa: E402
from strategies.wire.errors import ConfigError  # noqa: E402

__all__ = ["protocol_record", "set_record", "run_seed", "main"]

#: Trained federations: run config ``personalisation.method`` -> the methods it measures.
_TRAINED = {"finetune": ("fedavg-global", "finetune"), REPTILE: (REPTILE,),
            "per-fedavg-fo": ("per-fedavg-fo",), "fedbn": ("fedbn",)}


def protocol_record(protocol: Protocol, quick: bool) -> dict:
    """The JSON's ``protocol``: what every set of one output file shares."""
    return {**asdict(protocol), "passes_per_site_round": protocol.passes, "optimizer": "sgd",
            "momentum": 0.0, "quick": quick}


def set_record(bench_set: BenchSet) -> dict:
    """The JSON's ``sets[name]``: the set's settings (``--resume`` keeps seeds only when equal)."""
    return json.loads(json.dumps({**asdict(bench_set), "settings": asdict(bench_set.settings),
                                  "engine": "in-process"}))


def _timed(run: Callable[[], tuple]) -> tuple:
    """``run()``'s values, then its wall seconds."""
    start = time.perf_counter()
    return *run(), time.perf_counter() - start


def run_seed(bench_set: BenchSet, folders: list[Path], seed: int, protocol: Protocol,
             wanted: list[str], alphas: tuple[float, ...], workdir: Path) -> dict:
    """The variants in ``wanted`` on the sites ``folders`` with ``seed``: ``{variant:
    {"outcomes", "work", "seconds"}}`` (fedbn absent when the product refuses it for the
    task's model)."""
    out: dict[str, dict] = {}
    for name, methods in _TRAINED.items():
        for alpha in alphas if name == REPTILE else (SEED_ALPHA,):
            keys = [variant(m, alpha) for m in methods]
            if not set(keys) & set(wanted):
                continue
            config = run_config(bench_set, name, seed, protocol, alpha)
            try:
                outcomes, work, sampled, seconds = _timed(
                    lambda: federated_outcomes(folders, config, workdir))
            except ConfigError as exc:  # the product refuses FedBN for a model without BN
                print(f"{bench_set.name} {name}: refused by the product ({exc})", flush=True)
                continue
            for key in keys:
                kept = outcomes if key != "fedavg-global" else [
                    replace(o, personal_metrics=o.global_metrics, fallback=False)
                    for o in outcomes]
                out[key] = {"outcomes": kept, "work": work, "seconds": seconds,
                            "sampled": sampled}
    if "local-only" in wanted:
        per_round = sites_per_round(bench_set, protocol)
        steps, rest = divmod(bench_set.rounds * per_round * protocol.passes, len(folders))
        if rest:
            raise ValueError(f"set {bench_set.name}: rounds x sites per round x "
                             f"{protocol.passes} passes is not a multiple of the "
                             f"{len(folders)} sites (local only)")
        config = run_config(bench_set, "finetune", seed, protocol)
        outcomes, work, sampled, seconds = _timed(
            lambda: local_only(folders, config, steps, workdir))
        out["local-only"] = {"outcomes": outcomes, "work": work, "seconds": seconds,
                             "sampled": sampled}
    return out


def _print(rows: list[dict]) -> None:
    print_table("mean +- sd over seeds of the site-averaged metric (val split; hospitals: test)", [
        Column("set", "<15", lambda r: r["set"]), Column("method", "<19", lambda r: r["method"]),
        Column("alpha", "<6", lambda r: f"{r['alpha']:g}" if "alpha" in r else ""),
        Column("metric", "<8", lambda r: r["metric"]), Column("mean", "7.3f", lambda r: r["mean"]),
        Column("sd", ">6", lambda r: pm(r["sd"], None, ".3f")),
        Column("gain", "+7.3f", lambda r: r["gain_vs_fedavg_global"]),
        Column("seeds", "5d", lambda r: r["seeds"])], rows)


def _measure(bench_set: BenchSet, payload: dict, args: argparse.Namespace, protocol: Protocol,
             tmp: Path) -> None:
    """Every seed of ``bench_set`` missing a wanted variant; the output after each seed."""
    wanted = [v for v in variants(tuple(args.alphas)) if split_variant(v)[0] in args.methods]
    records = payload["per_seed"].setdefault(bench_set.name, [])
    by_seed = {r["seed"]: r for r in records}
    for seed in range(args.seeds):
        record = by_seed.get(seed) or {"seed": seed, "methods": {}}
        missing = [k for k in wanted if k not in record["methods"]]
        if record["methods"] and not [k for k in missing if k != "fedbn"]:
            continue  # complete (a measured seed without fedbn: the product refused it)
        root = tmp / f"{bench_set.name}-seed{seed}"
        build_sites(bench_set, args.shared, root / "sites", seed)
        folders = sorted(p for p in (root / "sites").iterdir() if p.is_dir())
        results = run_seed(bench_set, folders, seed, protocol, missing, tuple(args.alphas),
                           root / "runs")
        record["methods"].update(seed_record(results, bench_set.metrics))
        if seed not in by_seed:
            records.append(record)
            by_seed[seed] = record
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
    p.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
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
    p.add_argument("--output", type=Path, default=ROOT / "bench/results/personalisation.json")
    p.add_argument("--resume", action="store_true",
                   help="keep the seeds and methods --output holds for the same set settings")
    args = p.parse_args(argv)
    protocol = QUICK if args.quick else Protocol()
    sets = [shortened(SETS[name], args.sites, args.rounds, args.max_per_site)
            for name in args.sets]
    if args.quick:
        args.seeds = 1
        sets = [quick_set(s) for s in sets]
    payload: dict = {
        "description": "personalised FL (issues 16, 34): per-site val metric (a set of real "
                       "hospitals: test metric) after the last round, "
                       "mean +- sd over seeds; equal local computation",
        "protocol": protocol_record(protocol, args.quick),
        "sets": {s.name: set_record(s) for s in sets}, "runs": [], "skipped": [], "per_seed": {},
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
    _print(payload["runs"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
