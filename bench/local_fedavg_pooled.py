"""Local training at each site alone vs FedAvg vs pooled training, same total work.

Three configurations of the product, each run by the in-process engine
(:func:`app.engine.run_federation`: the real ServerApp and ClientApp, the
default norm-bound defence, the reply intake, the site policy) on site
folders written by the product's converter (``python -m clients.datagen
shared``). All three do the same total number of optimiser steps
``S_total`` with the product's Adam (lr 1e-3, beta1 0.9), the same batch size
and the same seeded initial model:

1. **local**: ``K`` federations; in the ``k``-th only site ``k`` trains
   (``S_total / K`` steps in one round, one optimiser state), the other sites
   run the evaluate-only site policy (``configs/site-policy-evaluate-only.toml``)
   and measure the model;
2. **FedAvg**: one federation of the ``K`` sites, ``R`` rounds x ``tau`` local
   steps, ``R * tau * K = S_total``;
3. **pooled** (centralised): one federation where a site folder holding every
   site's items (:func:`federation_sites.pooled_folder`) trains ``S_total``
   steps in one round and the ``K`` sites only measure.

Every model is measured by the sites' own evaluate replies on their
validation splits; the summary is the example-weighted mean over sites of ROC
AUC and accuracy (AUC left out where a site's split has one class), or of
Dice for segmentation. For the local regime the row is the mean over the
``K`` site-alone models of their all-site mean; their own-site score is
reported too.

Labels (honestly): ``cxr-cls`` here is **PneumoniaMNIST pneumonia vs normal**,
``ct3d-cls`` the **AdrenalMNIST3D label** (not emphysema), ``pe-seg-ctpa`` the
**pulmonary-artery mask of one CT** (z-blocks as studies) and
``pe-seg-msd-lung`` the **manual lung-tumour mask** of MSD Task06 patches
(2D, slab 1): neither is a pulmonary-embolism label. Usage::

    python bench/local_fedavg_pooled.py [--tasks cxr-cls] [--steps 48 --rounds 4] \\
        [--max-per-site 200] [--repeats 1]
    python bench/local_fedavg_pooled.py --tasks pe-seg-msd-lung \\
        --output bench/results/local_fedavg_pooled_seg.json

The output keeps the entries it does not measure.
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import ROOT  # noqa: I001

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

from engine_runs import run_product  # noqa: E402
from federation_sites import (convert_shared, folder_sites, pooled_folder,  # noqa: E402
                              site_evaluations, site_mean, train_totals)
from stats import markdown_table as table, pm, sd  # noqa: E402

__all__ = ["ENTRIES", "REGIMES", "Entry", "Budget", "compare", "combine_repeats", "markdown",
           "main"]

REGIMES = ("local", "fedavg", "pooled")


@dataclass(frozen=True)
class Entry:
    """One comparison's data: product task, converter arguments, task run config, label."""

    task: str
    converter_args: tuple[str, ...]
    settings: dict
    metrics: tuple[str, ...]
    label: str


ENTRIES = {
    "cxr-cls": Entry("cxr-cls", ("--scheme", "dirichlet", "--alpha", "0.5"),
                     {"image-size": 32, "batch-size": 16}, ("auc", "accuracy"),
                     "PneumoniaMNIST: pneumonia (1) vs normal (0), chest X-rays read at 32 px"),
    "ct3d-cls": Entry("ct3d-cls", ("--scheme", "iid"),
                      {"image-size": 32, "volume-depth": 16, "batch-size": 4,
                       "model-size": "small"}, ("auc", "accuracy"),
                      "AdrenalMNIST3D label (adrenal mass shape); NOT emphysema"),
    "pe-seg-ctpa": Entry("pe-seg", ("--set", "ctpa", "--scheme", "iid"),
                         {"image-size": 64, "slab-slices": 9, "batch-size": 8}, ("dice",),
                         "pulmonary-artery mask (TotalSegmentator output) of one CTPA-like CT, "
                         "z-blocks as studies; NOT pulmonary embolism"),
    "pe-seg-msd-lung": Entry("pe-seg", ("--set", "msd-lung", "--scheme", "size"),
                             {"image-size": 48, "slab-slices": 1, "batch-size": 16}, ("dice",),
                             "manual lung-tumour masks, MSD Task06 48 px CT patches (2D, slab "
                             "1); NOT pulmonary embolism"),
}


@dataclass(frozen=True)
class Budget:
    """The step budget of one comparison: ``S_total``, FedAvg's rounds, the training seed."""

    steps_total: int
    rounds: int
    seed: int = 0


def _overrides(entry: Entry, budget: Budget, rounds: int, local_steps: int, sites: int) -> dict:
    return {"task": entry.task, **entry.settings, "optimizer": "adam", "lr": 1e-3,
            "momentum": 0.9, "seed": budget.seed, "num-server-rounds": rounds,
            "local-steps": local_steps, "min-nodes": sites, "experiment": "local-fedavg-pooled"}


def _measured(outcome, entry: Entry, sites: list[str]) -> dict:
    """The model's per-site validation metrics at ``sites`` and their weighted means."""
    evaluations = site_evaluations(outcome)
    per_site = {s: {k.removeprefix("val-"): v for k, v in evaluations[s].items()}
                for s in sites}
    keys = [*entry.metrics, "loss"]
    return {"per_site": per_site, "mean": {k: site_mean(per_site, k) for k in keys}}


def run_local(folders: list[Path], entry: Entry, budget: Budget, workdir: Path) -> dict:
    """Each site alone: ``S_total / K`` steps in one round; the others only measure."""
    steps = budget.steps_total // len(folders)
    names = [f.name for f in folders]
    models, done = [], 0
    for k, folder in enumerate(folders):
        sites = folder_sites(folders, evaluate_only=[f for f in folders if f != folder])
        outcome, _ = run_product(_overrides(entry, budget, 1, steps, len(sites)), sites, workdir)
        done += sum(t["steps"] for t in train_totals(outcome).values())
        measured = _measured(outcome, entry, names)
        measured["trained_at"] = folder.name
        measured["own_site"] = measured["per_site"][folder.name]
        models.append(measured)
    keys = list(models[0]["mean"])
    return {"steps_done": done, "steps_per_site": steps, "models": models,
            "mean": {k: _nanmean(m["mean"][k] for m in models) for k in keys},
            "own_site_mean": {k: _nanmean(m["own_site"].get(k, math.nan) for m in models)
                              for k in keys}}


def run_fedavg(folders: list[Path], entry: Entry, budget: Budget, workdir: Path) -> dict:
    """FedAvg: ``R`` rounds of ``S_total / (R K)`` steps at every site."""
    tau = budget.steps_total // (budget.rounds * len(folders))
    sites = folder_sites(folders)
    outcome, _ = run_product(_overrides(entry, budget, budget.rounds, tau, len(sites)), sites,
                             workdir)
    last = outcome.reports[budget.rounds].train
    return {"steps_done": sum(t["steps"] for t in train_totals(outcome).values()),
            "rounds": budget.rounds, "local_steps": tau,
            "num_examples": {s: int(m["num-examples"]) for s, m in sorted(last.items())},
            **_measured(outcome, entry, [f.name for f in folders])}


def run_pooled(folders: list[Path], pooled: Path, entry: Entry, budget: Budget,
               workdir: Path) -> dict:
    """The pooled site trains ``S_total`` steps in one round; the sites only measure."""
    sites = folder_sites([pooled, *folders], evaluate_only=folders)
    outcome, _ = run_product(_overrides(entry, budget, 1, budget.steps_total, len(sites)),
                             sites, workdir)
    (report,) = outcome.reports.values()
    return {"steps_done": train_totals(outcome)[pooled.name]["steps"],
            "num_train": int(report.train[pooled.name]["num-examples"]),
            "refused": dict(report.train_dropped),
            **_measured(outcome, entry, [f.name for f in folders])}


def _nanmean(values) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.fmean(finite) if finite else math.nan


def compare(folders: list[Path], pooled: Path, entry: Entry, budget: Budget,
            workdir: Path) -> dict:
    """The three regimes on ``folders``; ``S_total`` must split evenly into rounds x sites."""
    k = len(folders)
    if budget.steps_total % (budget.rounds * k):
        raise ValueError(f"--steps {budget.steps_total} must be a multiple of "
                         f"rounds x sites = {budget.rounds * k}")
    out, timing = {}, {}
    for name, run in (("local", lambda: run_local(folders, entry, budget, workdir)),
                      ("fedavg", lambda: run_fedavg(folders, entry, budget, workdir)),
                      ("pooled", lambda: run_pooled(folders, pooled, entry, budget, workdir))):
        t0 = time.perf_counter()
        out[name] = run()
        timing[name] = time.perf_counter() - t0
    return {"config": {"steps_total": budget.steps_total, "rounds": budget.rounds,
                       "seed": budget.seed, "lr": 1e-3, "momentum": 0.9},
            "regimes": out, "seconds": timing,
            "summary": {name: out[name]["mean"] for name in REGIMES},
            "local_own_site": out["local"]["own_site_mean"]}


def combine_repeats(runs: list[dict]) -> dict:
    """Several :func:`compare` results (training seeds) -> mean and sd per regime and metric.

    One run is returned unchanged; otherwise ``summary`` / ``local_own_site`` hold
    the means over the runs, ``summary_sd`` / ``local_own_site_sd`` the sample
    standard deviations, and ``runs`` every run in full.
    """
    if len(runs) == 1:
        return runs[0]

    def stats(get) -> tuple[dict, dict]:
        keys = list(get(runs[0]))
        values = {k: [get(r)[k] for r in runs] for k in keys}
        return ({k: _nanmean(v) for k, v in values.items()},
                {k: sd(x for x in v if math.isfinite(x)) for k, v in values.items()})

    summary, summary_sd = {}, {}
    for name in REGIMES:
        summary[name], summary_sd[name] = stats(lambda r, n=name: r["summary"][n])
    own, own_sd = stats(lambda r: r["local_own_site"])
    return {"config": {**runs[0]["config"], "seeds": [r["config"]["seed"] for r in runs]},
            "summary": summary, "summary_sd": summary_sd,
            "local_own_site": own, "local_own_site_sd": own_sd,
            "seconds": {n: sum(r["seconds"][n] for r in runs) for n in REGIMES}, "runs": runs}


_TITLES = {"auc": "mean val AUC", "accuracy": "mean val accuracy", "dice": "mean val Dice"}


def markdown(name: str, result: dict) -> str:
    """The result as the markdown table of docs/BENCHMARKS.md."""
    s, spread, cfg = result["summary"], result.get("summary_sd"), result["config"]
    regimes = result["runs"][0]["regimes"] if "runs" in result else result["regimes"]
    keys = [k for k in s["fedavg"] if k != "loss"]
    seeds = f"; mean +- sd over training seeds {cfg['seeds']}" if "seeds" in cfg else ""
    label = ENTRIES[name].label if name in ENTRIES else name
    rows = [(title, s[key], spread[key] if spread else None)
            for key, title in (("local", "local (site-alone models, all sites)"),
                               ("fedavg", "FedAvg"), ("pooled", "pooled (centralised)"))]
    rows.append(("local, own site only", result["local_own_site"],
                 result.get("local_own_site_sd")))
    return (f"**{name}** — {label}; S_total = {cfg['steps_total']} steps, FedAvg R = "
            f"{cfg['rounds']} x tau = {regimes['fedavg']['local_steps']}{seeds}\n\n"
            + table(["regime", *(_TITLES.get(k, k) for k in keys)],
                    ([title, *(pm(values[k], sds[k] if sds else None, ".3f", sign="+-")
                               for k in keys)] for title, values, sds in rows)))


def measure(name: str, args: argparse.Namespace, tmp: Path) -> dict:
    """One entry: its site folders (once), the pooled folder, ``--repeats`` comparisons."""
    entry = ENTRIES[name]
    capped = ("--max-per-site", str(args.max_per_site)) if args.max_per_site else ()
    converter = [*entry.converter_args, "--sites", str(args.sites), "--seed", str(args.seed),
                 *capped]
    folders = convert_shared(entry.task, args.shared, tmp / name / "sites", converter)
    pooled = pooled_folder(folders, tmp / name / "pooled" / "pooled")
    result = combine_repeats([
        compare(folders, pooled, entry, Budget(args.steps, args.rounds, args.seed + r),
                tmp / name / "runs")
        for r in range(args.repeats)])
    regimes = result["runs"][0]["regimes"] if "runs" in result else result["regimes"]
    first_local = regimes["local"]["models"][0]["per_site"]
    result.update({"label": entry.label, "settings": entry.settings, "converter_args": converter,
                   "engine": "in-process", "sites": [
                       {"site": s, "val": int(m["num-examples"])}
                       for s, m in first_local.items()],
                   "pooled_train": regimes["pooled"]["num_train"],
                   "wall_seconds": sum(result["seconds"].values())})
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    p.add_argument("--tasks", nargs="+", default=["cxr-cls"], choices=sorted(ENTRIES))
    p.add_argument("--sites", type=int, default=3)
    p.add_argument("--seed", type=int, default=0, help="site split and first training seed")
    p.add_argument("--steps", type=int, default=48, help="S_total, optimiser steps per regime")
    p.add_argument("--rounds", type=int, default=4, help="FedAvg's rounds R")
    p.add_argument("--max-per-site", type=int, default=0, help="converter cap (0: none)")
    p.add_argument("--repeats", type=int, default=1,
                   help="training seeds seed .. seed + N - 1 (the site split stays --seed's)")
    p.add_argument("--output", type=Path, default=ROOT / "bench/results/local_fedavg_pooled.json")
    args = p.parse_args(argv)
    started = time.perf_counter()
    kept = json.loads(args.output.read_text()) if args.output.is_file() else {}
    results = dict(kept.get("results", {}))
    with tempfile.TemporaryDirectory(prefix="local-fedavg-pooled-") as tmp:
        for name in args.tasks:
            results[name] = measure(name, args, Path(tmp))
            print(markdown(name, results[name]), "\n", flush=True)
    payload = {
        "description": "local (site-alone) vs FedAvg vs pooled training, same total optimiser "
                       "steps; entries with engine 'in-process' ran through the product",
        "device": "cpu", "threads": 1, "engine": "in-process", "results": results,
        "wall_seconds": time.perf_counter() - started,
        "commands": [*kept.get("commands", []),
                     " ".join(["python", "bench/local_fedavg_pooled.py",
                               *(sys.argv[1:] if argv is None else argv)])],
        "versions": {"python": platform.python_version(), "platform": platform.platform()},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wall time {payload['wall_seconds']:.1f} s -> {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
