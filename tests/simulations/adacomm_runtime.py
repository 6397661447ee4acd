"""AdaComm vs fixed local steps under the local-update SGD runtime model.

Compares the adaptive communication period of Wang & Joshi, "Adaptive
Communication Strategies to Achieve the Best Error-Runtime Trade-off in
Local-Update SGD", SysML 2019 (``strategies.local_steps.adacomm_tau``, loss
smoothed with ``LossSmoother``) against fixed ``tau`` on a simulated wall
clock.

Problem: non-IID federated least squares (:mod:`least_squares`,
``make_least_squares_federation``): ``M`` sites with unequal data, different
feature scales (curvatures) and different true weights; every site runs
mini-batch SGD with a constant learning rate; the server averages with
``fedavg_delta``. With a constant lr, ``tau = 1`` reaches the lowest loss but
pays the communication delay every step; a large ``tau0`` is fast at first
but plateaus higher (client drift across heterogeneous sites).

Runtime model (:mod:`least_squares`): a round takes the slowest site's ``tau`` step
times ``0.5 + Exp(mean 0.5)`` (mean 1 = one local step time) plus ``D = 10``.

AdaComm: the first round uses ``tau0``; after round ``l`` the sites' losses on
their first mini-batch (i.e. at the global model, as a site reports its
initial training loss) are averaged with weights ``p_i``, smoothed
(``LossSmoother``), and ``tau_(l+1) = adacomm_tau(F_l, F_0, tau0, tau_min)``
with ``F_0`` the first observation. **Intervals are rounds here**, whereas the
paper updates ``tau`` once per wall-clock interval ``T_0``: the federated
server only acts at round boundaries (it cannot change a site's ``tau`` in the
middle of a round), a Flower run is configured per round, and the wall-clock
duration of a round depends on ``tau`` itself, so a round is the natural,
implementable interval; updating every round reacts at least as fast as the
paper's ``T_0`` schedule (smoothing replaces the paper's averaging over an
interval).

Reported (per problem seed, curves averaged over run seeds): the final loss of
each method at a fixed simulated-time budget (mean of the seed-averaged curve
over the last 10% of the budget), and the simulated time each method needs to
reach fixed ``tau = 1``'s final loss (first time its seed-averaged curve,
smoothed by a trailing mean over 5% of the budget, is at or below it). Losses
are exact training losses ``F(x)`` of the global model; the excess
``F(x) - F(x*)`` is reported too. Targets (issue): AdaComm needs at most half
of ``tau = 1``'s time, and ends below fixed ``tau0``.

Results go to ``bench/results/adacomm_runtime.json``. Usage::

    .venv/bin/python -m tests.simulations.adacomm_runtime [--problem-seeds 5] [--run-seeds 8]
"""

from __future__ import annotations

from tests.simulations import simulation  # noqa: I001 - first: one BLAS thread before numpy

import numpy as np  # noqa: E402

from bench.curves import trailing_mean  # noqa: E402
from bench.report import Column, environment, print_table  # noqa: E402
from tests.simulations.least_squares import (  # noqa: E402
    make_least_squares_federation,
    run_local_update_sgd,
)

#: The printed table; a row is (problem, method name, method results).
COLUMNS = (
    Column("fed", ">3", lambda r: r[0]["problem_seed"]),
    Column("method", "<8", lambda r: r[1]),
    Column("tau", "5.1f", lambda r: r[2]["tau_mean"]),
    Column("rounds", "7.0f", lambda r: r[2]["rounds_mean"]),
    Column("final F", "8.4f", lambda r: r[2]["final_loss"]),
    Column("excess", "8.5f", lambda r: r[2]["final_excess_loss"]),
    Column("t->tau1", "8.0f", lambda r: r[2]["time_to_tau1_final"]),
    Column("vs tau1", "7.2f", lambda r: r[2]["time_to_tau1_final"]
           / r[0]["methods"]["tau=1"]["time_to_tau1_final"]),
)

PROBLEM = {
    "num_sites": 8,
    "dim": 20,
    "min_examples": 200,
    "max_examples": 1000,
    "signal_norm": 10.0,
    "heterogeneity": 0.3,
    "label_noise": 0.3,
    "scale_spread": 2.0,
}
TRAINING = {"lr": 0.02, "batch_size": 4, "start": "x0 = 0"}
RUNTIME = {"step_shift": 0.5, "step_scale": 0.5, "comm_delay": 10.0}
ADACOMM = {"tau0": 16, "tau_min": 1, "tau_max": None, "smoothing": 0.9}
FIXED_TAUS = [1, 4, 16]  # 16 = tau0
BUDGET = 20000.0  # simulated time units (1 unit = mean local step time)
GRID_POINTS = 2001
FINAL_FRACTION = 0.10  # final loss = mean over the last 10% of the budget
SMOOTH_FRACTION = 0.05  # trailing-mean window for time-to-target
TARGET_SPEEDUP = 0.5  # AdaComm time <= 0.5 x tau=1's time


def loss_on_grid(times: np.ndarray, losses: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Loss of the latest model available at each grid time (step function)."""
    idx = np.searchsorted(times, grid, side="right") - 1
    return losses[np.clip(idx, 0, len(losses) - 1)]


def time_to_reach(grid: np.ndarray, curve: np.ndarray, target: float) -> float:
    """First grid time at which ``curve <= target`` (``inf`` if never)."""
    hit = np.nonzero(curve <= target)[0]
    return float(grid[hit[0]]) if hit.size else float("inf")


def run_problem(problem_seed: int, run_seeds: int) -> dict:
    """All methods on one federation, curves averaged over ``run_seeds``."""
    fed = make_least_squares_federation(seed=problem_seed, **PROBLEM)
    x_star = fed.optimum()
    f_star = fed.loss(x_star)
    f_init = fed.loss(np.zeros(PROBLEM["dim"]))
    grid = np.linspace(0.0, BUDGET, GRID_POINTS)
    tail = grid >= (1.0 - FINAL_FRACTION) * BUDGET
    window = max(1, int(round(SMOOTH_FRACTION * (GRID_POINTS - 1))))

    methods: dict[str, dict] = {}
    for schedule in [*FIXED_TAUS, "adacomm"]:
        name = "adacomm" if schedule == "adacomm" else f"tau={schedule}"
        curves, finals, rounds, taus_mean, round_times = [], [], [], [], []
        tau_path = None
        for seed in range(run_seeds):
            trace = run_local_update_sgd(fed, schedule, BUDGET, TRAINING["lr"],
                                         TRAINING["batch_size"], seed=1000 * problem_seed + seed,
                                         **RUNTIME, **ADACOMM)
            curve = loss_on_grid(trace.times, trace.losses, grid)
            curves.append(curve)
            finals.append(float(curve[tail].mean()))
            rounds.append(len(trace.taus))
            taus_mean.append(float(trace.taus.mean()))
            round_times.append(float(np.diff(trace.times).mean()))
            if seed == 0 and schedule == "adacomm":
                # tau in use at 0, 1, 2, 5, 10, 25, 50, 100 % of the budget (seed 0).
                marks = [0.0, 0.01, 0.02, 0.05, 0.10, 0.25, 0.50, 1.0]
                idx = np.searchsorted(trace.times[1:], [m * BUDGET for m in marks], side="left")
                tau_path = {
                    f"{m:.0%}": int(trace.taus[min(i, len(trace.taus) - 1)])
                    for m, i in zip(marks, idx)
                }
        mean_curve = np.mean(curves, axis=0)
        methods[name] = {
            "schedule": schedule,
            "final_loss": float(mean_curve[tail].mean()),
            "final_excess_loss": float(mean_curve[tail].mean() - f_star),
            "final_loss_per_seed": finals,
            "rounds_mean": float(np.mean(rounds)),
            "tau_mean": float(np.mean(taus_mean)),
            "round_time_mean": float(np.mean(round_times)),
            "_curve": mean_curve,
            "_smoothed": trailing_mean(mean_curve, window),
        }
        if tau_path is not None:
            methods[name]["tau_at_budget_fraction_seed0"] = tau_path

    target = methods["tau=1"]["final_loss"]
    for m in methods.values():
        m["time_to_tau1_final"] = time_to_reach(grid, m["_smoothed"], target)
    # Robustness: time to reach (1 + eps) x tau=1's final *excess* loss.
    for m in methods.values():
        m["time_to_excess_multiple"] = {
            f"{mult:g}": time_to_reach(
                grid, m["_smoothed"], f_star + mult * (target - f_star)
            )
            for mult in (1.0, 1.25, 1.5, 2.0)
        }
    t_one = methods["tau=1"]["time_to_tau1_final"]
    t_ada = methods["adacomm"]["time_to_tau1_final"]
    tau0_name = f"tau={ADACOMM['tau0']}"
    summary = {
        "time_ratio_adacomm_over_tau1": t_ada / t_one,
        "final_excess_ratio_adacomm_over_tau0": methods["adacomm"]["final_excess_loss"]
        / methods[tau0_name]["final_excess_loss"],
        "final_excess_ratio_adacomm_over_tau1": methods["adacomm"]["final_excess_loss"]
        / methods["tau=1"]["final_excess_loss"],
        "speedup_target_met": bool(t_ada <= TARGET_SPEEDUP * t_one),
        "below_tau0_target_met": bool(
            methods["adacomm"]["final_loss"] < methods[tau0_name]["final_loss"]
        ),
    }
    for m in methods.values():
        del m["_curve"], m["_smoothed"]
    return {
        "problem_seed": problem_seed,
        "initial_loss": f_init,
        "optimal_loss": f_star,
        "initial_over_optimal": f_init / f_star,
        "hessian_eigen_range": [float(v) for v in np.linalg.eigvalsh(fed.hessian)[[0, -1]]],
        "tau1_final_loss_target": target,
        "methods": methods,
        "summary": summary,
    }


def simulate(args) -> dict:
    """Every federation's methods and the ratios over the federations."""
    problems = [run_problem(seed, args.run_seeds) for seed in range(args.problem_seeds)]
    ratios = [p["summary"]["time_ratio_adacomm_over_tau1"] for p in problems]
    tau0_ratios = [p["summary"]["final_excess_ratio_adacomm_over_tau0"] for p in problems]
    overall = {
        "time_ratio_adacomm_over_tau1_per_problem": ratios,
        "time_ratio_adacomm_over_tau1_mean": float(np.mean(ratios)),
        "time_ratio_adacomm_over_tau1_max": float(np.max(ratios)),
        "final_excess_ratio_adacomm_over_tau0_mean": float(np.mean(tau0_ratios)),
        "speedup_target_met_on_mean": bool(np.mean(ratios) <= TARGET_SPEEDUP),
        "speedup_target_met_all": all(p["summary"]["speedup_target_met"] for p in problems),
        "below_tau0_target_met_all": all(p["summary"]["below_tau0_target_met"] for p in problems),
    }
    return {
        "benchmark": "adacomm_runtime",
        "paper": "Wang & Joshi, SysML 2019 (AdaComm); runtime model of Joshi's book chapter",
        "problem": dict(PROBLEM, kind="non-IID least squares, see make_least_squares_federation"),
        "training": dict(TRAINING, aggregation="fedavg_delta", local_solver="mini-batch SGD"),
        "runtime_model": dict(
            RUNTIME,
            round_time="max_i sum_{k<=tau} Y_ik + D, Y_ik = step_shift + Exp(mean step_scale)",
            unit="mean local step time (= step_shift + step_scale = 1)",
            comm_delay_in_steps=RUNTIME["comm_delay"] / (RUNTIME["step_shift"] + RUNTIME["step_scale"]),
        ),
        "adacomm": dict(
            ADACOMM,
            rule="tau_(l+1) = adacomm_tau(F_l, F_0, tau0, tau_min, tau_max) = "
            "ceil(sqrt(F_l / F_0) tau0), clamped",
            loss_signal="p-weighted mean of the sites' first mini-batch losses (at the global "
            "model), smoothed by LossSmoother(beta=smoothing); F_0 = first observation",
            interval="every round (the paper uses wall-clock intervals T_0): the server can only "
            "change tau at round boundaries, a round's duration depends on tau itself, and a "
            "per-round update reacts at least as fast as a T_0 schedule",
        ),
        "fixed_taus": FIXED_TAUS,
        "budget": BUDGET,
        "grid_points": GRID_POINTS,
        "final_loss": f"mean of the run-seed-averaged exact loss F(x) over the last "
        f"{FINAL_FRACTION:.0%} of the budget",
        "time_to_target": f"first grid time where the run-seed-averaged loss, smoothed by a "
        f"trailing mean over {SMOOTH_FRACTION:.0%} of the budget, is <= fixed tau=1's final loss",
        "targets": {
            "speedup": f"AdaComm time <= {TARGET_SPEEDUP} x tau=1 time (all problem seeds)",
            "below_tau0": "AdaComm final loss < fixed tau0 final loss (all problem seeds)",
        },
        "notes": [
            "AdaComm sees the raw training loss, whose floor F(x*) > 0: its tau settles at "
            "ceil(tau0 * sqrt(F_floor / F_0)), 2-3 here (F_0 / F(x*) = 74-127), never 1; a low "
            "first mini-batch estimate of F_0 (single noisy observation) pushes it to 3.",
            "Time-to-target at exactly tau=1's final (floor) loss is sensitive to the floor's "
            "noise; time_to_excess_multiple gives the times for 1.25x-2x tau=1's final excess loss.",
            "A well-chosen fixed tau=4 is about as fast as AdaComm on this problem (the tau-dependent "
            "error floor only shows for large tau); AdaComm's advantage is needing no tuning of tau.",
        ],
        "problem_seeds": args.problem_seeds,
        "run_seeds": args.run_seeds,
        **environment(),
        "cpu_s": None,
        "overall": overall,
        "problems": problems,
    }


def show(report: dict) -> None:
    """The table of every federation's methods and the targets' line."""
    overall = report["overall"]
    print_table(f"budget {BUDGET:g} time units (1 = mean local step, D = "
                f"{RUNTIME['comm_delay']:g}), {report['run_seeds']} run seeds per federation; "
                "excess = F(x) - F(x*)", COLUMNS,
                ((p, name, m) for p in report["problems"] for name, m in p["methods"].items()))
    print(
        f"AdaComm/tau=1 time: mean {overall['time_ratio_adacomm_over_tau1_mean']:.2f}, "
        f"max {overall['time_ratio_adacomm_over_tau1_max']:.2f} (target <= {TARGET_SPEEDUP}: "
        f"{'met' if overall['speedup_target_met_on_mean'] else 'NOT met'} on the mean, "
        f"{'met' if overall['speedup_target_met_all'] else 'NOT met'} on every federation); "
        f"AdaComm/tau0 final excess loss: mean "
        f"{overall['final_excess_ratio_adacomm_over_tau0_mean']:.2f} (target < 1: "
        f"{'met' if overall['below_tau0_target_met_all'] else 'NOT met'})"
    )


def main(argv: list[str] | None = None) -> int:
    return simulation.main(__doc__, "adacomm_runtime",
                           {"--problem-seeds": (5, "federations 0..N-1"),
                            "--run-seeds": (8, "runs averaged per federation")},
                           simulate, show, argv)


if __name__ == "__main__":
    raise SystemExit(main())
