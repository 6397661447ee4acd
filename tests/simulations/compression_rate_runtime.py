"""Adaptive compression rate vs fixed top-k rates: simulated time to a target loss.

The adaptive rate of the book's chapter 3, §3.3.2 (sign-based online gradient
descent on the log kept fraction, :class:`strategies.plugins.schedules.codec_rate.
AdaptiveCodecRate`, the product's own class) against top-k + error feedback at a
grid of fixed rates, under slow, medium and fast links, in the time-to-target
framing of Wang & Joshi's AdaComm (:mod:`adacomm_runtime`).

Problem: non-IID federated least squares (:mod:`least_squares`,
:func:`make_least_squares_federation`), every site runs ``TAU`` mini-batch SGD
steps a round from the global model; its update ``delta_i = x - x_i`` goes through
the product's codec (:class:`strategies.compression.ErrorFeedback`, ``topk:<rate>``,
one residual per site kept across rounds and rates); the server decodes and
averages (:func:`strategies.aggregation.fedavg_delta`, via ``quadratic.aggregate``).

Runtime model: a round takes :func:`strategies.plugins.schedules.codec_rate.round_seconds`
``max_i (c_i + 8 b_i / L)``: site ``i``'s compute ``c_i`` (``TAU`` shifted-exponential
step times, mean 1 time unit each, as in the AdaComm benchmark) plus its payload
``b_i`` (the encoded top-k bytes, as sent) over the link ``L``. Only the uplink
counts (a fast or compressed downlink). ``L`` is set per scenario so that the
rate-1 payload takes ``ratio`` times a site's mean compute of a round (``TAU``
units): 30 (slow), 1 (medium), 0.03 (fast). The adaptive schedule (``ADAPTIVE``:
each rate kept ``interval`` rounds) sees this same time (its link-speed model) and
either the sites' first mini-batch losses at the global model (``adaptive``: what
a site reports as ``initial-loss``) or their full training losses
(``adaptive-full``: a clean signal), nothing exact.

Reported per link: for each fixed rate and for the adaptive schedule, the
simulated time until the exact loss ``F(x)`` first reaches the target
``F* + TARGET_EXCESS (F(0) - F*)`` (mean +- sd over seeds; each seed is a new
federation and new SGD noise), the best fixed rate in hindsight (lowest mean time),
and each adaptive variant / best (None where a seed never reached the target).
Usage::

    .venv/bin/python -m tests.simulations.compression_rate_runtime [--seeds 5]

Results go to ``bench/results/compression_rate_runtime.json``.
"""

from __future__ import annotations

from tests.simulations import simulation  # noqa: I001 - first: one BLAS thread before numpy

import math  # noqa: E402

import numpy as np  # noqa: E402

from bench.report import Column, environment, print_table  # noqa: E402
from bench.stats import defined, mean_sd  # noqa: E402
from strategies.compression import ErrorFeedback, decode, parse_spec  # noqa: E402
from strategies.plugins.schedules.codec_rate import (  # noqa: E402
    AdaptiveCodecRate,
    SiteRound,
    round_seconds,
)
from tests.simulations.least_squares import (  # noqa: E402
    local_sgd_least_squares,
    make_least_squares_federation,
    sample_step_times,
)
from tests.simulations.quadratic import aggregate  # noqa: E402

PROBLEM = {"num_sites": 8, "dim": 500, "min_examples": 200, "max_examples": 600,
           "signal_norm": 10.0, "heterogeneity": 0.3, "label_noise": 0.3, "scale_spread": 1.0}
TRAINING = {"lr": 0.005, "batch_size": 16, "tau": 5}
STEP_TIME = {"shift": 0.5, "scale": 0.5}  # Y = 0.5 + Exp(0.5): mean 1 time unit a step
LINKS = {"slow": 30.0, "medium": 1.0, "fast": 0.03}  # rate-1 payload time / mean compute
FIXED_RATES = [0.003, 0.01, 0.03, 0.1, 0.3, 1.0]
ADAPTIVE_SIGNALS = ["adaptive", "adaptive-full"]  # first mini-batch loss; full site loss
ADAPTIVE = {"min": 0.001, "max": 1.0, "step": 0.5, "interval": 8, "start": 0.03}
TARGET_EXCESS = 0.02  # target F* + 2% of the initial excess loss
MAX_ROUNDS = 600

COLUMNS = (
    Column("link", "<7", lambda r: r[0]),
    Column("rate", "<13", lambda r: r[1]),
    Column("time mean", "11.0f", lambda r: r[2]["time_mean"] or math.inf),
    Column("sd", "8.0f", lambda r: r[2]["time_sd"] or math.inf),
    Column("rounds", "7.0f", lambda r: r[2]["rounds_mean"]),
    Column("reached", "8d", lambda r: r[2]["reached"]),
    Column("final rate", "11.4f", lambda r: r[2]["final_rate_mean"]),
)


def site_losses(fed, x: np.ndarray) -> np.ndarray:
    """Each site's full training loss ``F_i(x)`` (all its rows; padding rows are zero)."""
    residual = fed.features @ x - fed.targets
    return 0.5 * (residual**2).sum(axis=1) / fed.num_examples


def run(fed, rate: float | str, link_mbps: float, target: float, seed: int) -> dict:
    """One federated run with top-k + EF at ``rate`` (a float, ``"adaptive"`` seeing the
    sites' first mini-batch losses, or ``"adaptive-full"`` seeing their full training
    losses) until the exact loss reaches ``target`` or ``MAX_ROUNDS``."""
    rng = np.random.default_rng(seed)
    num_sites, _, dim = fed.features.shape
    schedule = (AdaptiveCodecRate(min=ADAPTIVE["min"], max=ADAPTIVE["max"],
                                  step=ADAPTIVE["step"], link_mbps=link_mbps,
                                  interval=ADAPTIVE["interval"])
                if str(rate).startswith("adaptive") else None)
    start = parse_spec(f"topk:{ADAPTIVE['start'] if schedule else rate}")
    feedback = [ErrorFeedback(str(start)) for _ in range(num_sites)]
    x, clock, rates = np.zeros(dim), 0.0, []
    for _ in range(MAX_ROUNDS):
        if fed.loss(x) <= target:
            break
        spec = parse_spec(f"topk:{schedule.rate_for(start) if schedule else rate!r}")
        rates.append(spec.fraction)
        x_local, first_losses = local_sgd_least_squares(
            fed, x, TRAINING["tau"], TRAINING["lr"], TRAINING["batch_size"], rng)
        compute = sample_step_times(rng, num_sites, TRAINING["tau"], STEP_TIME["shift"],
                                    STEP_TIME["scale"]).sum(axis=1)
        if rate == "adaptive-full":
            first_losses = site_losses(fed, x)
        decoded, sites = np.zeros_like(x_local), []
        for i, ef in enumerate(feedback):
            ef.spec = spec
            payload = ef.step((x - x_local[i]).astype(np.float32))
            decoded[i] = x - decode(payload, spec, dim, 0)
            sites.append(SiteRound(float(compute[i]), 0.0, float(payload.size),
                                   int(fed.num_examples[i]), float(first_losses[i])))
        clock += round_seconds(sites, link_mbps)
        if schedule:
            schedule.observe(spec.fraction, sites)
        x = aggregate(x, decoded, fed.num_examples, "fedavg")
    reached = fed.loss(x) <= target
    return {"time": clock if reached else None, "rounds": len(rates),
            "final_rate": float(np.exp(np.mean(np.log(rates[-20:]))))}


def _summary(runs: list[dict]) -> dict:
    """Time to the target over the seeds (``None`` unless every seed reached it), rounds, rate."""
    times = [r["time"] for r in runs]
    time_mean, time_sd = mean_sd(times)
    return {"time_mean": time_mean, "time_sd": time_sd,
            "time_per_seed": times, "reached": len(defined(times)),
            "rounds_mean": float(np.mean([r["rounds"] for r in runs])),
            "final_rate_mean": float(np.exp(np.mean(np.log([r["final_rate"] for r in runs]))))}


def run_link(name: str, ratio: float, seeds: int) -> dict:
    """Every fixed rate and the adaptive schedule under one link, over ``seeds``."""
    methods: dict[str, list[dict]] = {}
    for seed in range(seeds):
        fed = make_least_squares_federation(seed=seed, **PROBLEM)
        f_star, f_zero = fed.loss(fed.optimum()), fed.loss(np.zeros(PROBLEM["dim"]))
        target = f_star + TARGET_EXCESS * (f_zero - f_star)
        dense_bits = 8.0 * ErrorFeedback("topk:1.0").step(
            np.ones(PROBLEM["dim"], np.float32)).size
        link_mbps = dense_bits / (ratio * TRAINING["tau"]) / 1e6
        for rate in [*FIXED_RATES, *ADAPTIVE_SIGNALS]:
            label = rate if isinstance(rate, str) else f"{rate:g}"
            methods.setdefault(label, []).append(run(fed, rate, link_mbps, target,
                                                     1000 * seed + 7))
    summary = {label: _summary(runs) for label, runs in methods.items()}
    fixed = {k: v for k, v in summary.items() if k not in ADAPTIVE_SIGNALS and v["time_mean"]}
    best = min(fixed, key=lambda k: fixed[k]["time_mean"])
    over_best = {k: summary[k]["time_mean"] / fixed[best]["time_mean"]
                 if summary[k]["time_mean"] else None for k in ADAPTIVE_SIGNALS}
    return {"link": name, "payload_time_over_compute": ratio, "methods": summary,
            "best_fixed_rate": best, "best_fixed_time_mean": fixed[best]["time_mean"],
            "over_best": over_best}


def simulate(args) -> dict:
    """Every link over ``args.seeds`` federations."""
    links = [run_link(name, ratio, args.seeds) for name, ratio in LINKS.items()]
    return {
        "benchmark": "compression_rate_runtime",
        "method": "sign-based OGD on the log kept fraction (book ch. 3 §3.3.2; Han, Wang, "
                  "Leung, ICDCS 2020), strategies/plugins/schedules/codec_rate.py",
        "problem": dict(PROBLEM, kind="non-IID least squares (make_least_squares_federation)"),
        "training": dict(TRAINING, codec="topk:<rate> + error feedback", aggregation="fedavg"),
        "runtime_model": "round = max_i (compute_i + 8 payload_i / link); compute = tau "
                         "steps of 0.5 + Exp(0.5); uplink only; link set so the rate-1 "
                         "payload takes ratio x the mean compute of a round",
        "links": LINKS, "fixed_rates": FIXED_RATES, "adaptive": ADAPTIVE,
        "target": f"F* + {TARGET_EXCESS:g} (F(0) - F*), exact loss; time = simulated time "
                  f"units (1 = mean local step) until first reached (max {MAX_ROUNDS} rounds)",
        "seeds": args.seeds, **environment(), "cpu_s": None, "results": links,
    }


def show(report: dict) -> None:
    """The table of every link's rates and each link's best fixed rate."""
    links = report["results"]
    print_table(f"time to F* + {TARGET_EXCESS:g} x initial excess, {report['seeds']} seeds",
                COLUMNS, ((r["link"], k, m) for r in links for k, m in r["methods"].items()))
    for r in links:
        ratios = ", ".join(f"{k} / best = " + (f"{v:.2f}" if v else "not reached on every seed")
                           for k, v in r["over_best"].items())
        print(f"{r['link']}: best fixed rate {r['best_fixed_rate']} "
              f"({r['best_fixed_time_mean']:.0f}); {ratios}")


def main(argv: list[str] | None = None) -> int:
    return simulation.main(__doc__, "compression_rate_runtime",
                           {"--seeds": (5, "federations (and runs) 0..N-1")}, simulate, show, argv)


if __name__ == "__main__":
    raise SystemExit(main())
