"""Privacy-utility of site-level DP-SGD: final metric at epsilon in {1, 3, 8, inf}, and its cost.

Each epsilon is a run config of the product (``privacy.*`` keys) run by the
in-process engine (:func:`app.engine.run_federation`: the real ServerApp and
ClientApp, FedAvg under the default norm-bound defence, the site policy and
the sites' privacy ledgers) on site folders written by the product's converter
(``python -m clients.datagen shared``). Two sets:

- ``pneumoniamnist``: PneumoniaMNIST (pneumonia vs normal, read at 32 px), 3
  sites by Dirichlet(0.5) label skew; metric = example-weighted mean validation
  ROC AUC over the sites (a site whose split has one class is left out);
- ``msd-lung``: MSD Task06 lung-tumour CT patches (48 px, slab 1), 3 sites by
  size skew; metric = example-weighted mean validation Dice.

``R`` rounds x ``tau`` local Adam steps per site; every run has its own fresh
site state directories, so its sites' privacy ledgers (one per site and dataset,
whichever federation) start empty. For a finite epsilon every
site trains with the product's DP-SGD (Opacus, Poisson sampling, clipping
``C``, the RDP accountant) at one noise multiplier, ``privacy.noise-multiplier``:
the one Opacus's :func:`opacus.accountants.utils.get_noise_multiplier` gives for
(epsilon, delta) over ``R * tau`` steps at the largest sampling rate ``q`` of the
sites (the smallest site ends the run at the target; the others below it). The
sites' training-set sizes come from the train replies of the non-private run,
which runs first. The epsilon each site really spent is its privacy ledger's,
reported in its last train reply. The Adam learning rate and ``C`` are per set
(:data:`SETS`; PneumoniaMNIST batch 256, lr 3e-3, C = 0.1, tuned at epsilon = 8: a
larger batch averages the same noise over more examples, De et al. 2022; msd-lung
batch 16, lr 1e-3, C = 1, untuned); the non-private reference (epsilon = inf) is the
product's plain training of its plain model. ``relative_to_nonprivate`` =
metric / that reference (same seed). Throughput: training samples per second
at the sites (steps x batch / the train replies' ``train-seconds``, rounds after
the first when there are several) of each private run over the non-private
run's (DP-compatible model vs the plain model), kept in ``runs``. The ``throughput``
rows are :func:`dp_throughput.dp_throughput`'s interleaved measurement per task
(cxr-cls, pe-seg, ct3d-cls), the DP overhead figure. A run without ``--sets``
measures only those and replaces the ``throughput`` rows of an existing ``--output``.

Writes ``--output`` (default ``bench/results/privacy_utility.json``) after every
run::

    python bench/privacy_utility.py [--repeats 1] [--rounds 4 --local-steps 10] \\
        [--max-per-site 300] [--sets pneumoniamnist msd-lung]
    python bench/privacy_utility.py --sets --throughput-pairs 5   # DP overhead only
    python bench/privacy_utility.py --quick   # wiring check: 1 round x 2 steps, 24 items a site
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import ROOT  # noqa: I001

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, replace  # noqa: E402
from pathlib import Path  # noqa: E402

from opacus.accountants.utils import get_noise_multiplier  # noqa: E402

from clients.training.private_training import poisson_sample_rate  # noqa: E402
from dp_throughput import TASK_SETTINGS, dp_throughput  # noqa: E402
from engine_runs import run_product  # noqa: E402
from federation_sites import (convert_shared, folder_sites, site_evaluations,  # noqa: E402
                              site_mean, train_totals)
from stats import mean_sd  # noqa: E402

__all__ = ["SETS", "PrivacySet", "noise_for", "run_epsilon", "main"]

DELTA = 1e-5


@dataclass(frozen=True)
class PrivacySet:
    """One set: product task, converter arguments, task run config, metric, Adam lr, C."""

    task: str
    converter_args: tuple[str, ...]
    settings: dict
    metric: str
    lr: float
    clip: float


SETS = {
    "pneumoniamnist": PrivacySet("cxr-cls", ("--sites", "3", "--scheme", "dirichlet",
                                             "--alpha", "0.5"),
                                 {"image-size": 32, "batch-size": 256}, "auc", 3e-3, 0.1),
    "msd-lung": PrivacySet("pe-seg", ("--set", "msd-lung", "--sites", "3", "--scheme", "size"),
                           {"image-size": 48, "slab-slices": 1, "batch-size": 16}, "dice",
                           1e-3, 1.0),
}


def noise_for(epsilon: float, train_sizes: list[int], batch_size: int, steps: int) -> float:
    """Noise multiplier reaching (``epsilon``, :data:`DELTA`) after ``steps`` at the largest
    Poisson sampling rate ``q = batch / n`` of the sites."""
    q = max(poisson_sample_rate(n, batch_size) for n in train_sizes)
    return float(get_noise_multiplier(target_epsilon=epsilon, target_delta=DELTA,
                                      sample_rate=q, steps=steps, accountant="rdp"))


def run_epsilon(folders: list[Path], spec: PrivacySet, sigma: float, args: argparse.Namespace,
                seed: int, workdir: Path) -> dict:
    """One federation at noise multiplier ``sigma`` (0: non-private); its metric, the
    sites' train sizes, spent epsilons and training throughput."""
    overrides = {"task": spec.task, **spec.settings, "optimizer": "adam", "lr": spec.lr,
                 "momentum": 0.9, "seed": seed, "num-server-rounds": args.rounds,
                 "local-steps": args.local_steps, "min-nodes": len(folders),
                 "experiment": "privacy-utility", "privacy.noise-multiplier": sigma,
                 "privacy.max-grad-norm": spec.clip, "privacy.delta": DELTA}
    workdir.mkdir(parents=True, exist_ok=True)
    state_root = Path(tempfile.mkdtemp(prefix="site-state-", dir=workdir))  # fresh ledgers
    outcome, seconds = run_product(overrides, folder_sites(folders, state_root=state_root),
                                   workdir)
    last = outcome.reports[max(outcome.reports)].train
    totals = train_totals(outcome, 2 if len(outcome.reports) > 1 else 1)  # warm sites
    return {"metric": site_mean(site_evaluations(outcome), f"val-{spec.metric}"),
            "train_sizes": {s: int(m["num-examples"]) for s, m in sorted(last.items())},
            "epsilon_spent": [last[s].get("epsilon") for s in sorted(last)],
            "samples_per_s": sum(t["steps"] for t in totals.values()) * spec.settings[
                "batch-size"] / sum(t["train-seconds"] for t in totals.values()),
            "seconds": seconds}


def _summary(runs: list[dict]) -> list[dict]:
    """Mean (and sd) per set and epsilon of the metric and of its ratio to the non-private run."""
    rows = []
    keys = sorted({(r["set"], r["epsilon"]) for r in runs},
                  key=lambda k: (k[0], math.inf if k[1] is None else k[1]))
    for name, eps in keys:
        group = [r for r in runs if (r["set"], r["epsilon"]) == (name, eps)]
        metric, metric_sd = mean_sd(r["metric"] for r in group)
        ratio, ratio_sd = mean_sd(r["relative_to_nonprivate"] for r in group)
        rows.append({"set": name, "epsilon": eps, "metric": metric, "metric_sd": metric_sd,
                     "relative_to_nonprivate": ratio, "relative_sd": ratio_sd,
                     "seeds": [r["seed"] for r in group]})
    return rows


def _tuned(spec: PrivacySet, args: argparse.Namespace) -> tuple[PrivacySet, float, float, int]:
    """``spec`` with the command line's ``--lr``, ``--clip`` and ``--batch-size``; those three."""
    lr, clip = args.lr or spec.lr, args.clip or spec.clip
    batch = args.batch_size or spec.settings["batch-size"]
    return (replace(spec, lr=lr, clip=clip, settings={**spec.settings, "batch-size": batch}),
            lr, clip, batch)


def _write(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, allow_nan=False, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    p.add_argument("--sets", nargs="*", default=list(SETS), choices=sorted(SETS))
    p.add_argument("--epsilons", nargs="+", type=float, default=[1.0, 3.0, 8.0, math.inf])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--local-steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=1, help="training seeds 0 .. repeats-1")
    p.add_argument("--seeds", type=int, nargs="+", help="these training seeds (not --repeats)")
    p.add_argument("--batch-size", type=int, help="override the set's batch size")
    p.add_argument("--lr", type=float, help="override the set's Adam learning rate")
    p.add_argument("--clip", type=float, help="override the set's clipping norm C")
    p.add_argument("--max-per-site", type=int, default=0, help="converter cap (0: none)")
    p.add_argument("--throughput-tasks", nargs="*", default=list(TASK_SETTINGS),
                   choices=sorted(TASK_SETTINGS))
    p.add_argument("--throughput-steps", type=int, default=10)
    p.add_argument("--throughput-pairs", type=int, default=3)
    p.add_argument("--quick", action="store_true",
                   help="1 round x 2 steps, 1 seed, 24 items a site (wiring check)")
    p.add_argument("--output", type=Path, default=ROOT / "bench/results/privacy_utility.json")
    args = p.parse_args(argv)
    args.seeds = args.seeds if args.seeds is not None else list(range(args.repeats))
    if args.quick:
        args.rounds, args.local_steps, args.seeds, args.max_per_site = 1, 2, [0], 24
        args.throughput_steps, args.throughput_pairs = 2, 1
    payload: dict = {
        "description": "FedAvg with site-level DP-SGD (Opacus, RDP) vs non-private training, "
                       "through the product (in-process engine)",
        "engine": "in-process",
        "config": {"rounds": args.rounds, "local_steps": args.local_steps,
                   "max_per_site": args.max_per_site, "seeds": args.seeds,
                   "lr_clip_batch": {name: _tuned(SETS[name], args)[1:] for name in args.sets},
                   "delta": DELTA, "optimizer": "adam", "device": "cpu", "threads": 1,
                   "quick": args.quick},
        "runs": [], "summary": [], "throughput": [],
        "commands": [" ".join(["python", "bench/privacy_utility.py",
                               *(sys.argv[1:] if argv is None else argv)])],
        "versions": {"python": platform.python_version(), "platform": platform.platform()},
    }
    if not args.sets and args.output.is_file():  # throughput only: keep the runs there
        kept = json.loads(args.output.read_text())
        payload = {**kept, "throughput": [], "commands": kept.get("commands", [])
                   + payload["commands"]}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="privacy-utility-") as tmp:
        for name in args.sets:
            _run_set(name, args, Path(tmp), payload)
            payload["wall_seconds"] = time.perf_counter() - start
            _write(args.output, payload)
        for task in args.throughput_tasks:
            payload["throughput"] += dp_throughput(task, args.throughput_steps,
                                                   args.throughput_pairs, Path(tmp))
            print(json.dumps(payload["throughput"][-2:]), flush=True)
            _write(args.output, payload)
    return 0


def _run_set(name: str, args: argparse.Namespace, tmp: Path, payload: dict) -> None:
    """Every seed and epsilon of set ``name`` (inf first: the reference); JSON after each run."""
    spec, *_ = _tuned(SETS[name], args)
    capped = ("--max-per-site", str(args.max_per_site)) if args.max_per_site else ()
    folders = convert_shared(spec.task, args.shared, tmp / name, [*spec.converter_args, *capped])
    for seed in args.seeds:
        reference, sizes = None, []
        for eps in sorted(args.epsilons, reverse=True):
            if math.isfinite(eps) and not sizes:
                raise ValueError("--epsilons must include inf (the reference run)")
            sigma = noise_for(eps, sizes, spec.settings["batch-size"],
                              args.rounds * args.local_steps) if sizes else 0.0
            out = run_epsilon(folders, spec, sigma, args, seed, tmp / "runs")
            sizes = sizes or list(out["train_sizes"].values())
            reference = out["metric"] if math.isinf(eps) else reference
            payload["runs"].append({
                "set": name, "epsilon": None if math.isinf(eps) else eps, "seed": seed,
                "metric_name": spec.metric, "metric": out["metric"],
                "relative_to_nonprivate": out["metric"] / reference,
                "noise_multiplier": sigma, "epsilon_spent": out["epsilon_spent"],
                "train_sizes": out["train_sizes"],
                "samples_per_s": out["samples_per_s"], "seconds": out["seconds"]})
            print(json.dumps(payload["runs"][-1]), flush=True)
            payload["summary"] = _summary(payload["runs"])
            _write(args.output, payload)


if __name__ == "__main__":
    raise SystemExit(main())
