"""FedAvg vs FedNova on the real PE-segmentation task with heterogeneous local work.

The task half of the "objective inconsistency" benchmark (the quadratic half,
with a known optimum, is ``tests/simulations/fednova_inconsistency.py``). Wang, Liu, Liang,
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

A study of :mod:`runner`: each run below is an arm (its run-config keys and
each site's ``local-steps-cap``). Usage::

    .venv/bin/python bench/fednova_pe_task.py --rounds 8 --momenta 0

Results: ``bench/results/fednova_pe_task.json`` (``--resume`` keeps its runs with
the same run config).
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import BENCH  # noqa: I001

import argparse  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import runner  # noqa: E402
from engine_runs import RoundSeries, synthetic_sites  # noqa: E402
from runner import Arm, Federation, Option  # noqa: E402
from stats import mean, mean_sd, pm  # noqa: E402
from clients.datagen.federation import hospital_name  # noqa: E402

__all__ = ["STUDY", "METHODS", "build_arms", "summarise", "main"]

METHODS = ("fedavg", "fednova")
NUM_SITES = 3
DESCRIPTION = ("FedAvg vs FedNova on the 2.5D U-Net PE segmentation task, 3 synthetic sites, "
               "local SGD, heterogeneous local steps (node_config local-steps-cap); the "
               "product's federation through the in-process engine.")
MEASURED = ("F_i = the product's pow-d query loss (DiceCE) of the model each round receives on "
            "site i's training slabs (cpow-d on --eval-slabs random slabs when > 0); index 0 = "
            "the initial model; F = sum_i p_i F_i; F~ with w_i = p_i a_i / sum_j p_j a_j.")


def _arm(name: str, method: str, taus: tuple[int, ...], lr: float, momentum: float,
         eval_slabs: int) -> Arm:
    """One federation: the rule, each site's tau (its ``local-steps-cap``), the local SGD."""
    return Arm(name, {
        "lr": lr, "momentum": momentum, "local-steps": max(taus), "strategy.aggregator": method,
        "fednova.min-steps-fraction": min(taus) / max(taus),
        "strategy.selector": "cpow-d" if eval_slabs else "pow-d", "selection.m": len(taus),
        "selection.d": len(taus), "selection.subset": eval_slabs},
        {"method": method, "taus": list(taus), "lr": lr, "momentum": momentum},
        tuple({"local-steps-cap": tau} for tau in taus))


def build_arms(args: argparse.Namespace, index: int = 0) -> list[Arm]:
    """FedAvg and FedNova with heterogeneous tau per momentum; the homogeneous FedAvg control.

    Raises
    ------
    ValueError
        Unless ``rounds >= 2`` and ``1 <= tail <= rounds``.
    """
    if args.rounds < 2 or not 1 <= args.tail <= args.rounds:
        raise ValueError("need rounds >= 2 and 1 <= tail <= rounds")
    arms = []
    for momentum in args.momenta:
        tag, scaled = f"sgd-m{momentum:g}", args.lr * (1.0 - momentum)
        arms += [_arm(f"{m}/het/{tag}", m, tuple(args.taus), scaled, momentum, args.eval_slabs)
                 for m in METHODS]
        if momentum == 0.0:
            arms.append(_arm(f"fedavg/hom/{tag}", "fedavg", (args.homogeneous_tau,) * NUM_SITES,
                             scaled, momentum, args.eval_slabs))
    return arms


def _federation(name: str, args: argparse.Namespace) -> Federation:
    folders = ([args.data_root / hospital_name(i) for i in range(NUM_SITES)]
               if args.data_root else synthetic_sites("pe-seg", NUM_SITES, 0, 96))
    return Federation(name, "dice", tuple(folders), {
        "task": "pe-seg", "image-size": args.image_size, "batch-size": args.batch_size,
        "optimizer": "sgd"})


def _fields(outcome, run: RoundSeries, workdir: Path) -> dict:
    """Per round the sites' F_i, val Dice, steps and a-norms; the sites' example shares."""
    reports = [outcome.reports[r] for r in sorted(outcome.reports)]
    names = sorted(reports[0].train)
    examples = np.array([reports[0].train[n]["num-examples"] for n in names], dtype=float)
    return {
        "F_sites": [[losses[n] for n in names] for losses in run.selection_losses],
        "val_dice": run.metrics["dice"],
        "val_dice_sites": [[r.evaluate[n]["val-dice"] for n in names] for r in reports],
        "steps": [[r.train[n]["steps"] for n in names] for r in reports],
        "a_norms": [[r.train[n]["a-norm"] for n in names] for r in reports],
        "p": (examples / examples.sum()).tolist()}


def summarise(rows: Sequence[dict], tail: int) -> dict:
    """Final F, F~ and per-site F_i per run; FedNova / FedAvg ratios; the het - hom gaps."""
    runs = {}
    for c in rows:
        p, a = np.asarray(c["p"]), np.mean(c["a_norms"], axis=0)
        w = p * a / float(p @ a)  # FedAvg's surrogate weights (Thm. 1)
        sites = np.asarray(c["F_sites"])
        F, F_surrogate = sites @ p, sites @ w
        f, f_sd = mean_sd(F[-tail:].tolist())
        d, d_sd = mean_sd(c["val_dice"][-tail:])
        runs[c["name"]] = {
            "method": c["method"], "taus": c["taus"], "lr": c["lr"],
            "momentum": c["momentum"], "a_norms": a.tolist(),
            "delta_weights": (p if c["method"] == "fedavg" else float(p @ a) * p / a).tolist(),
            "surrogate_weights_fedavg": w.tolist(), "F": F.tolist(),
            "final_F": f, "final_F_sd_over_tail": f_sd,
            "final_F_surrogate": mean(F_surrogate[-tail:].tolist()),
            "final_F_sites": sites[-tail:].mean(axis=0).tolist(),
            "final_val_dice": d, "final_val_dice_sd_over_tail": d_sd,
            "initial_F": float(F[0]), "best_F": float(F.min())}
    comparisons = {}
    for momentum in sorted({r["momentum"] for r in rows}):
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


def _summary(meta: dict, rows: list[dict], missing: list[str], args: argparse.Namespace) -> dict:
    return {"benchmark": meta["benchmark"], "engine": meta["engine"], "description": DESCRIPTION,
            "measured": MEASURED, "config": {**meta["setup"], "runs": [
                {k: r[k] for k in ("name", "method", "taus", "lr", "momentum")} for r in rows]},
            "curves": {r["name"]: r for r in rows}, "summary": summarise(rows, args.tail),
            "wall_seconds": meta.get("wall_seconds"), "versions": meta["versions"],
            "commands": meta["commands"]}


def table(payload: dict) -> str:
    """A short table of the final numbers."""
    summary = payload["summary"]
    lines = [f"final = mean of the last {summary['tail_rounds']} values",
             f"{'run':<22} {'tau':<12} {'lr':>6} {'F':>8} {'+-':>6} {'F~':>8} "
             f"{'F_i per site':<22} {'Dice':>6}"]
    for name, r in summary["runs"].items():
        sites = " ".join(f"{v:.3f}" for v in r["final_F_sites"])
        spread = pm(r["final_F_sd_over_tail"], None, ".4f")
        lines.append(f"{name:<22} {str(tuple(r['taus'])):<12} {r['lr']:>6.3g} "
                     f"{r['final_F']:>8.4f} {spread:>6} {r['final_F_surrogate']:>8.4f} "
                     f"{sites:<22} {r['final_val_dice']:>6.3f}")
    lines += [f"{tag}: " + "; ".join(f"{k} {v:+.4f}" for k, v in c.items()
                                     if isinstance(v, float))
              for tag, c in summary["comparisons"].items()]
    return "\n".join(lines)


def _option(flag: str, kind: type, default: object, **kwargs: object) -> Option:
    return Option(flag, {"type": kind, "default": default, **kwargs})


STUDY = runner.Study(
    name="fednova_pe_task", doc=__doc__, output=BENCH / "results" / "fednova_pe_task.json",
    sets=("pe",), federation=_federation, arms=build_arms,
    schedule=lambda args, baseline: {"num-server-rounds": args.rounds}, fields=_fields,
    summary=_summary, table=table,  # runs stored before the runner lack "set": run again
    rows_of=lambda payload: [r for r in payload.get("curves", {}).values() if "set" in r],
    arm_key="name", experiment="bench-fednova", defaults={"tail": 3},
    options=(_option("--rounds", int, 8), _option("--taus", int, [10, 40, 40], nargs=NUM_SITES),
             _option("--homogeneous-tau", int, 25),
             _option("--lr", float, 0.1, help="plain-SGD lr; with momentum m the lr is lr*(1-m)"),
             _option("--momenta", float, [0.0], nargs="+"), _option("--image-size", int, 32),
             _option("--batch-size", int, 8),
             _option("--eval-slabs", int, 0, help="0: F_i on the whole training split (pow-d); "
                     "k: cpow-d on k random slabs a query"),
             _option("--data-root", Path, None, help="folder with hospital-00..02 (default: "
                     "generated once under data/bench/)"), runner.SINGLE_SEED))


def main(argv: Sequence[str] | None = None) -> int:
    return runner.main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
