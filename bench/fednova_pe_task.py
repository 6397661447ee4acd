"""FedAvg vs FedNova on the real PE-segmentation task with heterogeneous local work.

The task half of the "objective inconsistency" benchmark (the quadratic half,
with a known optimum, is ``bench/fednova_inconsistency.py``). Wang, Liu, Liang,
Joshi, Poor, "Tackling the Objective Inconsistency Problem in Heterogeneous
Federated Optimization", NeurIPS 2020, Thm. 1: with plain local SGD and
``tau_i`` local steps, FedAvg converges to a stationary point of the *surrogate*

    F~(x) = sum_i w_i F_i(x),   w_i = p_i ||a_i||_1 / sum_j p_j ||a_j||_1

instead of the true global objective ``F(x) = sum_i p_i F_i(x)``; FedNova
(``delta = tau_eff sum_i p_i delta_i / ||a_i||_1``) restores the weights ``p_i``.

What runs (a configuration of the product, issue 27)
----------------------------------------------------
Three synthetic PE hospitals (``python -m clients.datagen synthetic --task
pe-seg --sites 3 --seed 0 --image-size 96``, 32 px slabs) as virtual sites of
the in-process engine (:mod:`engine_runs`): the real ServerApp and ClientApp,
so the reply intake, the default norm-bound defence, the size caps and the
site policy apply. The run config picks the rule (``strategy.aggregator`` =
``fedavg`` | ``fednova``), local SGD (``optimizer = "sgd"``, ``lr``,
``momentum``; with momentum m the lr is ``lr * (1 - m)``) and
``local-steps`` = max tau; each site's node_config ``local-steps-cap`` caps
its own tau (heterogeneous work, default 10 / 40 / 40), and the site reports
the steps it ran and its ``a-norm``, which FedNova weighs (``fednova.min-steps-fraction``
= min tau / max tau, so FedNova's floor on a reply's a-norm, 0.5 by default,
leaves this heterogeneity as it is). The same initial
model and per-(round, site) training seeds for every run (``seed``).

What is measured
----------------
``F_i`` is the task's loss of the global model on site ``i``'s training slabs:
the Power-of-Choice query of the product (``strategy.selector = "pow-d"`` with
``selection.m = selection.d = 3``, so every site is selected and each round first
reports ``F_i`` of the model it receives, on its whole training split; with
``--eval-slabs k > 0``, ``cpow-d`` on ``k`` slabs, which a site draws afresh for every
query since issue #28, so that answers cannot be differenced: a noisier ``F_i``). Round ``r``'s query
measures the model before round ``r``: the curves hold ``x_0 .. x_{R-1}``.
``F = sum_i p_i F_i`` (``p_i`` from the sites' example counts), FedAvg's
surrogate ``F~`` with the ``a-norms`` the sites reported, the per-site
``F_i`` and the validation Dice of each round's new model (``val-dice``).
"final" = mean over the last ``--tail`` values (and their spread).

There is no known optimum of ``F`` for a neural network: this measures the
objective reached after equal rounds, not a distance to ``x*``. The per-site
split is the inconsistency-specific signal (FedAvg favours long-tau sites).

Usage::

    .venv/bin/python bench/fednova_pe_task.py --rounds 8 --momenta 0

Results: ``bench/results/fednova_pe_task.json``.
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import BENCH  # noqa: I001

import argparse  # noqa: E402
import platform  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from engine_runs import run_product, series, synthetic_sites  # noqa: E402
from report import write_report  # noqa: E402
from stats import mean, mean_sd, pm  # noqa: E402
from clients.datagen.federation import hospital_name  # noqa: E402

__all__ = ["METHODS", "RunSpec", "build_specs", "run_spec", "summarise", "main"]

DEFAULT_OUTPUT = BENCH / "results" / "fednova_pe_task.json"
METHODS = ("fedavg", "fednova")
NUM_SITES = 3


@dataclass(frozen=True)
class RunSpec:
    """One federation: the rule, each site's tau, the local SGD."""

    name: str
    method: str
    taus: tuple[int, ...]
    lr: float
    momentum: float


def build_specs(taus: Sequence[int], homogeneous_tau: int, lr: float,
                momenta: Sequence[float]) -> list[RunSpec]:
    """FedAvg and FedNova with heterogeneous tau per momentum; the homogeneous FedAvg control."""
    specs = []
    for momentum in momenta:
        tag, scaled = f"sgd-m{momentum:g}", lr * (1.0 - momentum)
        specs += [RunSpec(f"{m}/het/{tag}", m, tuple(taus), scaled, momentum) for m in METHODS]
        if momentum == 0.0:
            specs.append(RunSpec(f"fedavg/hom/{tag}", "fedavg",
                                 (homogeneous_tau,) * len(taus), scaled, momentum))
    return specs


def run_spec(spec: RunSpec, folders: Sequence[Path], args: argparse.Namespace,
             workdir: Path) -> dict:
    """Run ``spec`` through the product; its curves (index 0 = the initial model)."""
    from app.engine import VirtualSite  # noqa: PLC0415 - the engine loads Flower

    sites = []
    for folder, tau in zip(folders, spec.taus):
        site = VirtualSite.folder(folder, site_name=folder.name)
        site.node_config = {**site.node_config, "local-steps-cap": tau}
        sites.append(site)
    overrides = {
        "task": "pe-seg", "image-size": args.image_size, "batch-size": args.batch_size,
        "optimizer": "sgd", "lr": spec.lr, "momentum": spec.momentum,
        "local-steps": max(spec.taus), "strategy.aggregator": spec.method,
        "fednova.min-steps-fraction": min(spec.taus) / max(spec.taus),
        "strategy.selector": "cpow-d" if args.eval_slabs else "pow-d",
        "selection.m": len(sites), "selection.d": len(sites),
        "selection.subset": args.eval_slabs, "num-server-rounds": args.rounds,
        "seed": args.seed, "experiment": "bench-fednova-pe"}
    outcome, seconds = run_product(overrides, sites, workdir)
    run = series(outcome)
    names = [folder.name for folder in folders]
    reports = [outcome.reports[r] for r in sorted(outcome.reports)]
    examples = np.array([reports[0].train[n]["num-examples"] for n in names], dtype=float)
    return {
        "F_sites": [[losses[n] for n in names] for losses in run.selection_losses],
        "val_dice": run.metrics["dice"],
        "val_dice_sites": [[r.evaluate[n]["val-dice"] for n in names] for r in reports],
        "steps": [[r.train[n]["steps"] for n in names] for r in reports],
        "a_norms": [[r.train[n]["a-norm"] for n in names] for r in reports],
        "p": (examples / examples.sum()).tolist(), "dropped": run.dropped,
        "seconds": seconds, "mlflow_run_id": outcome.mlflow_run_id, "run_config": overrides}


def summarise(specs: Sequence[RunSpec], curves: dict[str, dict], tail: int) -> dict:
    """Final F, F~ and per-site F_i per run; FedNova / FedAvg ratios; the het - hom gaps."""
    runs = {}
    for spec in specs:
        c = curves[spec.name]
        p, a = np.asarray(c["p"]), np.mean(c["a_norms"], axis=0)
        w = p * a / float(p @ a)  # FedAvg's surrogate weights (Thm. 1)
        sites = np.asarray(c["F_sites"])
        F, F_surrogate = sites @ p, sites @ w
        f, f_sd = mean_sd(F[-tail:].tolist())
        d, d_sd = mean_sd(c["val_dice"][-tail:])
        runs[spec.name] = {
            "method": spec.method, "taus": list(spec.taus), "lr": spec.lr,
            "momentum": spec.momentum, "a_norms": a.tolist(),
            "delta_weights": (p if spec.method == "fedavg" else float(p @ a) * p / a).tolist(),
            "surrogate_weights_fedavg": w.tolist(), "F": F.tolist(),
            "final_F": f, "final_F_sd_over_tail": f_sd,
            "final_F_surrogate": mean(F_surrogate[-tail:].tolist()),
            "final_F_sites": sites[-tail:].mean(axis=0).tolist(),
            "final_val_dice": d, "final_val_dice_sd_over_tail": d_sd,
            "initial_F": float(F[0]), "best_F": float(F.min())}
    comparisons = {}
    for momentum in sorted({s.momentum for s in specs}):
        tag = f"sgd-m{momentum:g}"
        avg, nova = runs.get(f"fedavg/het/{tag}"), runs.get(f"fednova/het/{tag}")
        hom, entry = runs.get(f"fedavg/hom/{tag}"), {}
        if avg and nova:
            entry["ratio_F_fednova_over_fedavg"] = nova["final_F"] / avg["final_F"]
            entry["ratio_F_surrogate_fednova_over_fedavg"] = (
                nova["final_F_surrogate"] / avg["final_F_surrogate"])
            entry["F_sites_fednova_minus_fedavg"] = [
                x - y for x, y in zip(nova["final_F_sites"], avg["final_F_sites"])]
        for name, run in (("fedavg", avg), ("fednova", nova)):
            if run and hom:
                entry[f"F_gap_{name}_het_minus_hom"] = run["final_F"] - hom["final_F"]
        comparisons[tag] = entry
    return {"tail_rounds": tail, "runs": runs, "comparisons": comparisons}


def print_table(summary: dict) -> None:
    """A short table of the final numbers."""
    print(f"\nfinal = mean of the last {summary['tail_rounds']} values")
    print(f"{'run':<22} {'tau':<12} {'lr':>6} {'F':>8} {'+-':>6} {'F~':>8} "
          f"{'F_i per site':<22} {'Dice':>6}")
    for name, r in summary["runs"].items():
        sites = " ".join(f"{v:.3f}" for v in r["final_F_sites"])
        spread = pm(r["final_F_sd_over_tail"], None, ".4f")
        print(f"{name:<22} {str(tuple(r['taus'])):<12} {r['lr']:>6.3g} {r['final_F']:>8.4f} "
              f"{spread:>6} {r['final_F_surrogate']:>8.4f} {sites:<22} "
              f"{r['final_val_dice']:>6.3f}")
    for tag, c in summary["comparisons"].items():
        print(f"{tag}: " + "; ".join(f"{k} {v:+.4f}" for k, v in c.items()
                                     if isinstance(v, float)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--taus", type=int, nargs=NUM_SITES, default=[10, 40, 40])
    parser.add_argument("--homogeneous-tau", type=int, default=25)
    parser.add_argument("--lr", type=float, default=0.1,
                        help="plain-SGD lr; with momentum m the lr is lr*(1-m)")
    parser.add_argument("--momenta", type=float, nargs="+", default=[0.0])
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--eval-slabs", type=int, default=0,
                        help="0: F_i on the whole training split (pow-d); k: cpow-d on k "
                             "random slabs a query")
    parser.add_argument("--tail", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-root", type=Path, default=None,
                        help="folder with hospital-00..02 (default: generated once under "
                             "data/bench/)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="MLflow store of the runs (default: a temporary folder)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    if args.rounds < 2 or not 1 <= args.tail <= args.rounds:
        parser.error("need rounds >= 2 and 1 <= tail <= rounds")
    started = time.perf_counter()
    folders = ([args.data_root / hospital_name(i) for i in range(NUM_SITES)]
               if args.data_root else synthetic_sites("pe-seg", NUM_SITES, 0, 96))
    specs = build_specs(args.taus, args.homogeneous_tau, args.lr, args.momenta)
    curves: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="fednova-pe-") as tmp:
        for spec in specs:
            curves[spec.name] = run_spec(spec, folders, args, args.workdir or Path(tmp))
            print(f"{spec.name:<22} done in {curves[spec.name]['seconds']:.1f} s", flush=True)
    summary = summarise(specs, curves, args.tail)
    write_report(args.output, {
        "benchmark": "fednova_pe_task", "engine": "in-process",
        "description": "FedAvg vs FedNova on the 2.5D U-Net PE segmentation task, 3 synthetic "
                       "sites, local SGD, heterogeneous local steps (node_config "
                       "local-steps-cap); the product's federation through the in-process "
                       "engine.",
        "measured": "F_i = the product's pow-d query loss (DiceCE) of the model each round "
                    "receives on site i's training slabs (cpow-d on --eval-slabs random slabs "
                    "when > 0); index 0 = the "
                    "initial model; F = sum_i p_i F_i; F~ with w_i = p_i a_i / sum_j p_j a_j.",
        "config": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                   "sites": [str(f) for f in folders], "runs": [asdict(s) for s in specs]},
        "curves": curves, "summary": summary, "wall_seconds": time.perf_counter() - started,
        "python": platform.python_version()}, indent=1)
    print_table(summary)
    print(f"\nresults in {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
