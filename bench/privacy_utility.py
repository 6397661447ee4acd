"""Privacy-utility of site-level DP-SGD: final metric at epsilon in {1, 3, 8, inf}, and its cost.

In-process FedAvg (no Flower) with the product's task classes on site folders
written by the product's converter (:mod:`clients.datagen.shared`), as in
``bench/local_fedavg_pooled.py``: ``R`` rounds x ``tau`` local Adam steps per
site from the global model, aggregated with
:func:`strategies.aggregation.fedavg_delta`. Two sets:

- ``pneumoniamnist``: PneumoniaMNIST (pneumonia vs normal, 28 px), 3 sites by
  Dirichlet(0.5) label skew; metric = example-weighted mean validation ROC AUC;
- ``msd-lung``: MSD Task06 lung-tumour CT patches (48 px, slab 1), 3 sites by
  size skew; metric = mean validation Dice.

For a finite epsilon every site trains with DP-SGD
(:meth:`clients.training.site_task.SiteTask.train` with ``privacy``; Opacus,
Poisson sampling, clipping ``C``, RDP accountant) at the noise multiplier that
Opacus's :func:`opacus.accountants.utils.get_noise_multiplier` gives for the
target (epsilon, delta) over the site's planned ``R * tau`` steps at its sampling
rate ``q`` (so each site ends the run at the target epsilon); the epsilon the
site really spent (its accountant's history, as the privacy ledger keeps it) is
reported too. The Adam learning rate and ``C`` are per set (:data:`SETS`):
PneumoniaMNIST lr 3e-3, C = 0.1 (tuned at epsilon = 8 over lr {1e-3, 3e-3, 1e-2} x
C {0.1, 1}; a tuned lr and a small C, as De et al. 2022, arXiv:2204.13650, and
Tramer & Boneh 2021, arXiv:2011.11660, advise), msd-lung lr 1e-3, C = 1 (untuned);
the non-private reference trains at the same lr. Private runs use the DP-compatible
model (``build_model(private=True)``); the non-private reference (epsilon = inf) is the
product's plain training of its plain model, i.e. what a run without
``privacy.noise-multiplier`` gets. ``relative_to_nonprivate`` = metric / that
reference (same seed). Throughput: samples per second of DP-SGD over plain
training of the same (DP-compatible) model and data at one site, one thread, for
each of Opacus's per-example gradient modes the product can use (``hooks``, the
product's, and ``functorch``).

Writes ``--output`` (default ``bench/results/privacy_utility.json``) after every
run (partial results survive an interrupted run)::

    python bench/privacy_utility.py --shared /work/shared/data [--repeats 2] \\
        [--rounds 10 --local-steps 20] [--sets pneumoniamnist msd-lung]
    python bench/privacy_utility.py --quick   # wiring check: 2 rounds x 2 steps
    python bench/privacy_utility.py --throughput-only   # only the throughput rows
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from opacus.accountants import RDPAccountant
from opacus.accountants.utils import get_noise_multiplier

from local_fedavg_pooled import ROOT, build_sites, evaluate_all, load_tasks
from model_arrays import load_arrays, state_arrays
from clients.training.device import ComputeDevice, select_device
from clients.training.private_training import (GRAD_SAMPLE_MODES, DpSettings,
                                               poisson_sample_rate)
from clients.training.site_task import SiteTask, TaskSettings
from strategies.aggregation import fedavg_delta

__all__ = ["SETS", "noise_for", "run_federation", "throughput", "main"]

#: set -> (product task, converter arguments, task settings, metric, (Adam lr, clipping C)).
SETS = {
    "pneumoniamnist": ("cxr-cls", ["--sites", "3", "--scheme", "dirichlet", "--alpha", "0.5"],
                       TaskSettings(image_size=28, batch_size=64), "auc", (3e-3, 0.1)),
    "msd-lung": ("pe-seg", ["--set", "msd-lung", "--sites", "3", "--scheme", "size"],
                 TaskSettings(image_size=48, slab_slices=1, batch_size=16), "dice", (1e-3, 1.0)),
}
MOMENTUM, DELTA = 0.9, 1e-5


def noise_for(epsilon: float, task: SiteTask, steps: int) -> float:
    """Noise multiplier reaching (``epsilon``, :data:`DELTA`) after ``steps`` at ``task``'s rate."""
    q = poisson_sample_rate(len(task.train_set), task.settings.batch_size)
    return float(get_noise_multiplier(target_epsilon=epsilon, target_delta=DELTA,
                                      sample_rate=q, steps=steps, accountant="rdp"))


def run_federation(tasks: list[SiteTask], epsilon: float, rounds: int, tau: int, seed: int,
                   compute: ComputeDevice, lr: float, clip: float) -> dict:
    """FedAvg for ``rounds`` rounds of local Adam at ``lr``; DP-SGD with clipping norm
    ``clip`` at every site when ``epsilon`` is finite."""
    private = math.isfinite(epsilon)
    torch.manual_seed(seed)
    global_model = tasks[0].build_model(private=private)
    sigmas = [noise_for(epsilon, t, rounds * tau) if private else 0.0 for t in tasks]
    histories: list[list] = [[] for _ in tasks]
    counts = [len(t.train_set) for t in tasks]
    for r in range(rounds):
        x_global = state_arrays(global_model)
        deltas = []
        for i, task in enumerate(tasks):
            local = copy.deepcopy(global_model)
            privacy = DpSettings(sigmas[i], clip, DELTA) if private else None
            res = task.train(local, tau, lr, MOMENTUM, compute, seed=seed + 101 * i + 7919 * (r + 1),
                             optimizer="adam", label=f"eps={epsilon}/r{r}/{i}", privacy=privacy)
            histories[i].extend(res.privacy_steps)
            deltas.append([np.asarray(g - x) for g, x in zip(x_global, state_arrays(local))])
        delta = fedavg_delta(deltas, counts)
        load_arrays(global_model, [g - d for g, d in zip(x_global, delta)])
    spent = []
    for history in histories:
        accountant = RDPAccountant()
        accountant.history = list(history)
        spent.append(float(accountant.get_epsilon(DELTA)) if history else math.inf)
    return {"noise_multipliers": sigmas, "epsilon_spent": spent,
            **evaluate_all(global_model, tasks, compute)}


def throughput(task: SiteTask, steps: int, compute: ComputeDevice, lr: float, clip: float,
               repeats: int = 3) -> dict:
    """Samples/s of plain and of DP-SGD training (sigma 1, C ``clip``) of the DP-compatible model.

    DP-SGD once per Opacus grad-sample mode of :data:`GRAD_SAMPLE_MODES`; the row's
    ``dp_samples_per_s`` is the product's default mode's (:class:`DpSettings`).
    Median over ``repeats`` measurements of ``steps`` steps each, the variants
    interleaved (the machine's load drifts).
    """
    variants = {"plain": None, **{mode: DpSettings(1.0, clip, DELTA, grad_sample_mode=mode)
                                  for mode in GRAD_SAMPLE_MODES}}
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for repeat in range(repeats):
        for name, privacy in variants.items():
            torch.manual_seed(0)
            model = task.build_model(private=True)
            task.train(model, 2, lr, MOMENTUM, compute, seed=0, privacy=privacy)  # warm-up
            res = task.train(model, steps, lr, MOMENTUM, compute, seed=1 + repeat,
                             privacy=privacy)
            samples[name].append(res.num_examples / res.seconds)
    rates = {name: statistics.median(values) for name, values in samples.items()}
    mode = DpSettings().grad_sample_mode
    return {"plain_samples_per_s": rates["plain"], "dp_samples_per_s": rates[mode],
            "dp_over_plain": rates[mode] / rates["plain"], "grad_sample_mode": mode,
            "dp_over_plain_by_mode": {m: rates[m] / rates["plain"] for m in GRAD_SAMPLE_MODES},
            "steps": steps, "repeats": repeats}


def _write(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, allow_nan=False, default=str) + "\n")


def _summary(runs: list[dict]) -> list[dict]:
    """Mean (and sd) per set and epsilon of the metric and of its ratio to the non-private run."""
    rows = []
    keys = sorted({(r["set"], r["epsilon"]) for r in runs},
                  key=lambda k: (k[0], math.inf if k[1] is None else k[1]))
    for name, eps in keys:
        group = [r for r in runs if (r["set"], r["epsilon"]) == (name, eps)]
        metric = [r["metric"] for r in group]
        ratio = [r["relative_to_nonprivate"] for r in group]
        rows.append({"set": name, "epsilon": eps, "metric": statistics.fmean(metric),
                     "metric_sd": statistics.stdev(metric) if len(metric) > 1 else 0.0,
                     "relative_to_nonprivate": statistics.fmean(ratio),
                     "relative_sd": statistics.stdev(ratio) if len(ratio) > 1 else 0.0,
                     "seeds": [r["seed"] for r in group]})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", type=Path, default=Path("/work/shared/data"))
    p.add_argument("--sets", nargs="+", default=list(SETS), choices=sorted(SETS))
    p.add_argument("--epsilons", nargs="+", type=float, default=[1.0, 3.0, 8.0, math.inf])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--local-steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=2, help="training seeds 0 .. repeats-1")
    p.add_argument("--throughput-steps", type=int, default=20)
    p.add_argument("--throughput-repeats", type=int, default=3)
    p.add_argument("--throughput-only", action="store_true",
                   help="measure only the throughput rows of --sets, kept runs of --output")
    p.add_argument("--quick", action="store_true", help="2 rounds x 2 steps, 1 seed (wiring check)")
    p.add_argument("--output", type=Path, default=ROOT / "bench/results/privacy_utility.json")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.local_steps, args.repeats, args.throughput_steps = 2, 2, 1, 2
        args.throughput_repeats = 1
    torch.set_num_threads(1)
    compute = select_device("cpu")
    payload: dict = {
        "description": "FedAvg with site-level DP-SGD (Opacus, RDP) vs non-private training",
        "config": {"rounds": args.rounds, "local_steps": args.local_steps,
                   "lr_clip": {name: SETS[name][4] for name in args.sets},
                   "delta": DELTA, "optimizer": "adam", "device": "cpu",
                   "threads": 1, "quick": args.quick},
        "runs": [], "summary": [], "throughput": [],
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "platform": platform.platform()},
    }
    if args.throughput_only:
        kept = json.loads(args.output.read_text()) if args.output.is_file() else {}
        payload.update({k: kept[k] for k in ("description", "config", "runs", "wall_seconds")
                        if k in kept})
        payload["throughput"] = [r for r in kept.get("throughput", []) if r["set"] not in args.sets]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.sets:
            task_name, extra, settings, metric, (lr, clip) = SETS[name]
            site_root = Path(tmp) / name
            build_sites(task_name, args.shared, site_root, extra)
            tasks = load_tasks(task_name, site_root, settings)
            for seed in range(0 if args.throughput_only else args.repeats):
                reference = None
                for eps in sorted(args.epsilons, reverse=True):  # inf first: the reference
                    t0 = time.perf_counter()
                    out = run_federation(tasks, eps, args.rounds, args.local_steps, seed, compute,
                                         lr, clip)
                    value = float(out["mean"][metric])
                    reference = value if math.isinf(eps) else reference
                    payload["runs"].append({
                        "set": name, "epsilon": None if math.isinf(eps) else eps, "seed": seed,
                        "metric_name": metric, "metric": value,
                        "relative_to_nonprivate": value / reference if reference else None,
                        "epsilon_spent": [None if math.isinf(e) else e
                                          for e in out["epsilon_spent"]],
                        "noise_multipliers": out["noise_multipliers"],
                        "seconds": time.perf_counter() - t0})
                    print(json.dumps(payload["runs"][-1]), flush=True)
                    _write(args.output, payload)
            rate = throughput(tasks[0], args.throughput_steps, compute, lr, clip,
                              args.throughput_repeats)
            payload["throughput"].append({"task": task_name, "set": name, **rate})
            payload["summary"] = _summary(payload["runs"])
            seconds = "throughput_wall_seconds" if args.throughput_only else "wall_seconds"
            payload[seconds] = time.perf_counter() - start
            _write(args.output, payload)
            print(json.dumps(payload["throughput"][-1]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
