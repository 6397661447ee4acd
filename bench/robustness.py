"""Attack benchmark: one bad site against each defence, on a simulated federation (issue #12).

A non-IID federated least-squares problem (``sim_local_sgd``: per-site
features, scales and targets; mini-batch SGD at the sites) runs ``SETUP["rounds"]``
rounds of local-update SGD. The server's side is the product's: each round's
replies are :class:`strategies.replies.TrainReply` values, FedNova's a-norm
comes from the reported steps (:class:`strategies.local_solver.LocalSolver`),
and the update is aggregated by the plug-ins the run config would build
(:mod:`strategies.plugins.registries`, options at their defaults) behind the chosen
defence (:func:`strategies.plugins.defences.defended.with_defence`). Replies
with NaN/inf updates and missing replies never reach the aggregator: the
product's reply validation (:func:`strategies.replies.parse_train_reply`)
drops them, and the simulation does the same.

Attacks (by the smallest site, every round): ``inflated-n`` (claims 1e15
examples, honest update), ``bad-a-norm`` (reports 1 local step of the tau it
did, so FedNova divides its update by a-norm 1), ``scaled`` (update x1000),
``sign-flip`` (minus its update), ``nan`` (NaN/inf entries), ``noise`` (a
standard-normal vector instead of its update), ``always-fails`` (never
replies). ``none`` is the clean run of each defence.

Metric: the global training loss ``F(x)`` of the final model over all sites'
data (lower is better); ``relative_to_clean`` is ``F / F_clean`` with
``F_clean`` the plain FedAvg run without attack, mean over seeds (FedNova
equals FedAvg here when nobody attacks: every site does the same tau).
Target of #12: every attack within 2% of the clean metric with the default
defence, at most 1% cost when nobody attacks. A diverged run (non-finite
model) is recorded with ``metric`` and ``relative_to_clean`` null.

The attacks, the defences and the server's round are shared with the
real-data benchmark (``bench/robustness_real.py``: PneumoniaMNIST, the PE
task) in ``bench/robustness_attacks.py``; both merge their sets into the same
JSON (:func:`robustness_attacks.merge_report`), each replacing only its own.

    .venv/bin/python bench/robustness.py            # -> bench/results/robustness.json
    .venv/bin/python bench/robustness.py --quick    # a few seconds (the test)
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy loads, and the project importable.
from single_thread import BENCH  # noqa: I001

import argparse  # noqa: E402
import math  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from report import Column, environment, print_table  # noqa: E402
from robustness_attacks import (ATTACKS, DEFENCES_RUN, build_aggregator, merge_report,  # noqa: E402
                                server_update)
from sim_local_sgd import local_sgd_least_squares, make_least_squares_federation  # noqa: E402
from strategies.local_solver import LocalSolver  # noqa: E402
from strategies.plugins.run_settings import RunSettings  # noqa: E402
from strategies.replies import TrainReply  # noqa: E402
from strategies.rounds.site_book import SiteBook  # noqa: E402

__all__ = ["ATTACKS", "DEFENCES_RUN", "main", "run_federation"]

DEFAULT_OUTPUT = BENCH / "results" / "robustness.json"
SET = "least-squares-sim"
SETUP = {"sites": 10, "dim": 20, "rounds": 40, "tau": 10, "lr": 0.02, "batch_size": 8,
         "seeds": 3, "scale_spread": 0.5, "heterogeneity": 0.3, "inflated_n": 10**15,
         "scale": 1000.0, "noise_std": 1.0}
QUICK = {**SETUP, "rounds": 8, "seeds": 1}
TARGET_RELATIVE = 0.02

def run_federation(defence: str, attack: str, seed: int, setup: dict) -> float:
    """Final global loss ``F(x)`` of one run (NaN if the model diverged)."""
    fed = make_least_squares_federation(setup["sites"], setup["dim"], seed,
                                        heterogeneity=setup["heterogeneity"],
                                        scale_spread=setup["scale_spread"])
    settings = RunSettings(local_steps=setup["tau"], num_rounds=setup["rounds"],
                           fraction_train=1.0, min_nodes=setup["sites"], seed=seed,
                           optimizer="sgd")
    aggregator = build_aggregator(defence, settings)
    book = SiteBook()
    attacker = int(np.argmin(fed.num_examples))
    a_norm = LocalSolver().a_norm(setup["tau"])
    rng = np.random.default_rng(seed + 1000)
    x = np.zeros(setup["dim"])
    for _ in range(setup["rounds"]):
        local, losses = local_sgd_least_squares(fed, x, setup["tau"], setup["lr"],
                                                setup["batch_size"], rng)
        replies = [TrainReply(node_id=i, site=f"site-{i}", delta=[x - local[i]],
                              num_examples=int(fed.num_examples[i]), steps=setup["tau"],
                              train_loss=float(losses[i]), a_norm=a_norm)
                   for i in range(setup["sites"])]
        delta = server_update(aggregator, replies, attacker, attack, rng, setup, book)
        with np.errstate(all="ignore"):
            x = x - delta[0]
        if not np.isfinite(x).all():
            return math.nan
    return fed.loss(x)


def _mean(values: list[float]) -> float | None:
    return None if any(math.isnan(v) for v in values) else float(np.mean(values))


def benchmark(setup: dict) -> dict:
    """The report: clean metric per set and one run per (attack, defence)."""
    seeds = range(setup["seeds"])
    metrics = {(d, a): _mean([run_federation(d, a, s, setup) for s in seeds])
               for d in DEFENCES_RUN for a in ATTACKS}
    clean = metrics[("fedavg", "none")]
    runs = []
    for (defence, attack), metric in metrics.items():
        relative = None if metric is None else metric / clean
        runs.append({"set": SET, "attack": attack, "defence": defence, "metric": metric,
                     "relative_to_clean": relative,
                     "within_target": relative is not None
                     and abs(relative - 1.0) <= TARGET_RELATIVE})
    return {
        "clean": {SET: clean},
        "runs": runs,
        "sets": {SET: {
            "description": "non-IID federated least squares (bench/sim_local_sgd.py); the "
                           "attacker is the smallest site",
            "metric_name": "final global training loss F(x)", "direction": "lower is better"}},
        "setup": setup,
        "target": {"relative": TARGET_RELATIVE, "metric": "lower is better"},
        "environment": environment(),
    }


def _relative(value: float | None) -> str:
    if value is None:
        return "diverged"
    return f"{value:.4f}" if value < 1e3 else f"{value:.1e}"


def _table(report: dict) -> None:
    rows = {(r["defence"], r["attack"]): r["relative_to_clean"] for r in report["runs"]}
    columns = [Column("defence", "<19", lambda d: d)] + [
        Column(a, ">12", lambda d, a=a: _relative(rows[(d, a)])) for a in ATTACKS]
    print_table(f"final loss / clean ({SET}; clean FedAvg {report['clean'][SET]:.4f})",
                columns, DEFENCES_RUN)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds, one seed (tests)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON output path")
    args = parser.parse_args(argv)
    report = benchmark(QUICK if args.quick else SETUP)
    merge_report(args.output, report)
    _table(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
