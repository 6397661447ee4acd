"""SecAgg+ against the plain round, through the product (#30).

A benchmark run is a configuration: PneumoniaMNIST dealt over Dirichlet(0.5) sites
(iid shares at 50 sites) by the product's converter (``python -m clients.datagen
shared``), the product's run config (``strategy.defence = "none"`` in both arms:
SecAgg+ refuses robust rules that need individual updates) and the in-process engine (:func:`app.engine.run_federation`:
the real ServerApp against the real ClientApp at every site). The secure arm sets
``strategy.secure-aggregation = "secagg+"``; drop-outs are sites that go silent at the
unmask stage, after their masked input was sent (:class:`app.engine.SiteFaults`
``silent_stages``), every round.

Measured per run (one JSON row per sites x drop-out, the plain arm shared):

* ``round_seconds_*``: mean wall seconds of a round after the first (train + evaluate;
  a discarded warm-up federation loads each site count's data first; the engine
  runs the sites one after another in one process, so the protocol's work at every
  site adds up; a drop-out also costs the ``round.deadline`` wait at the unmask stage);
* ``bytes_up_*``: mean serialised bytes one site sends in a round (secure: all five
  stages), and ``*_ratio``: over the model's dense float32 bytes;
* ``sum_exact``: every round's unmasked sum equals the sum mod ``m`` of the levels
  the sites quantised, bit for bit (observed in this process: the sites' levels as
  :meth:`Participant.mask_levels` receives them, the coordinator's
  :attr:`SecureSum.exact`);
* ``metric_*``: the final global model's ``val-auc`` (example-weighted over the sites).

Two more rows at 10 sites: rand-k 0.1 (both arms), and 50 local steps instead of 10 (the
protocol's per-site work, serial in the engine, against more training). ``timing``: the
10-site round time measured apart, 4 plain and 4 secure federations in alternation
(the median round of each: one row's 2 timed rounds drift with the shared machine). ``--accuracy``
adds the convergence comparison at 10 sites over 3 seeds (mean and sd).

    .venv/bin/python bench/secure_aggregation.py            # -> bench/results/secure_aggregation.json
    .venv/bin/python bench/secure_aggregation.py --quick --output /tmp/s.json   # the test
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import BENCH  # noqa: I001

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from engine_runs import DATA, run_product, shared_sites  # noqa: E402
from report import Column, environment, print_table, write_report  # noqa: E402
from stats import defined, mean_sd  # noqa: E402
from clients.datagen.federation import hospital_name  # noqa: E402

__all__ = ["main", "run_arm", "sum_witness"]

DEFAULT_OUTPUT = BENCH / "results" / "secure_aggregation.json"
GRID = {"sites": (3, 10, 50), "dropouts": (0.0, 0.1, 0.3), "rounds": 3, "local_steps": 10,
        "randk": "randk:0.1", "randk_sites": 10, "long_steps": 50, "accuracy_rounds": 10,
        "seeds": (0, 1, 2), "timing_sites": 10, "timing_pairs": 4, "timing_rounds": 4}
QUICK = {"sites": (4,), "dropouts": (0.0, 0.3), "rounds": 1, "local_steps": 2,
         "randk": "randk:0.1", "randk_sites": 4, "long_steps": 4, "accuracy_rounds": 1,
         "seeds": (0,), "timing_sites": 4, "timing_pairs": 1, "timing_rounds": 2}
#: Sites dealt by Dirichlet(0.5) up to this count; more get iid shares (PneumoniaMNIST's
#: 2,698 training images leave no Dirichlet draw with 10 images at each of 50 sites).
DIRICHLET_SITES = 10
SETTINGS = {"task": "cxr-cls", "image-size": 32, "batch-size": 16,
            "strategy.defence": "none", "round.deadline": 1.0, "round.quorum": 2,
            "node-wait-timeout": 30.0, "experiment": "bench-secure-aggregation"}


@contextlib.contextmanager
def sum_witness() -> Iterator[list[bool]]:
    """Observe every secure round in this process: one bool per round, whether the unmasked
    sum equals the sum mod ``m`` of the summed sites' quantised levels."""
    from strategies.secure_aggregation.coordinator import SecAggRound  # noqa: PLC0415
    from strategies.wire.secure_aggregation.participant import Participant  # noqa: PLC0415

    levels: dict[tuple[int, int], np.ndarray] = {}
    verdicts: list[bool] = []
    mask_levels, finish = Participant.mask_levels, SecAggRound.finish

    def seen_levels(self, values):
        levels[(self.plan.server_round, self.plan.index)] = np.array(values, dtype=np.uint64)
        return mask_levels(self, values)

    def checked_finish(self):
        result = finish(self)
        expected = np.zeros_like(result.exact)
        for node in result.summed:
            expected += levels[(self.server_round, self.index[node])]
        expected &= np.uint64((1 << self.modulus_bits) - 1)
        verdicts.append(bool(np.array_equal(expected, result.exact)))
        return result

    Participant.mask_levels, SecAggRound.finish = seen_levels, checked_finish
    try:
        yield verdicts
    finally:
        Participant.mask_levels, SecAggRound.finish = mask_levels, finish


def _sites(count: int, dropout: float, seed: int) -> list:
    from app.engine import SiteFaults, VirtualSite  # noqa: PLC0415 - the engine loads Flower

    folders = shared_sites("cxr-cls", "pneumoniamnist", count, seed,
                           scheme="dirichlet" if count <= DIRICHLET_SITES else "iid",
                           alpha=0.5, root=DATA / f"secagg-sites-{count}")
    silent = set(range(round(dropout * count)))
    return [VirtualSite.folder(folder, site_name=hospital_name(i),
                               faults=SiteFaults(silent_stages=("unmask",)) if i in silent
                               else SiteFaults())
            for i, folder in enumerate(folders)]


def run_arm(sites: int, dropout: float, seed: int, rounds: int, local_steps: int,
            secure: bool, codec: str, workdir: Path) -> dict:
    """One federation; its round seconds, per-site uplink bytes, exactness and final AUC."""
    overrides = {**SETTINGS, "num-server-rounds": rounds, "local-steps": local_steps,
                 "min-nodes": sites, "seed": seed, "strategy.codec": codec,
                 "strategy.secure-aggregation": "secagg+" if secure else "none"}
    from strategies.wire.errors import FederationError  # noqa: PLC0415

    with sum_witness() as verdicts:
        try:
            outcome, wall = run_product(overrides, _sites(sites, dropout, seed), workdir)
        except FederationError as error:  # e.g. no round could be unmasked
            return {"round_seconds": None, "bytes_up": None, "dense_fp32_bytes": 0,
                    "metric": None, "sum_exact": None, "rounds_unmasked": len(verdicts),
                    "wall_s": None, "dropped": [], "failed": str(error)[:300],
                    "aggregation_failed": []}
    reports = [outcome.reports[r] for r in sorted(outcome.reports)]
    dense = sum(4 * a.size for a in outcome.arrays.to_numpy_ndarrays() if a.dtype.kind == "f")
    up = [sum(t.get("bytes-up", 0.0) for t in r.traffic.values()) / max(len(r.traffic), 1)
          for r in reports]
    timed = reports[1:] or reports  # round 1 pays one-off costs (model build, first batches)
    return {"round_seconds": statistics.fmean(r.seconds for r in timed),
            "bytes_up": statistics.fmean(up), "dense_fp32_bytes": dense,
            "metric": reports[-1].evaluate_aggregate.get("val-auc"),
            "sum_exact": bool(verdicts) and all(verdicts) if secure else None,
            "rounds_unmasked": len(verdicts), "wall_s": wall,
            "dropped": sorted({s for r in reports for s in r.train_dropped}), "failed": None,
            "aggregation_failed": [r.aggregation_failed for r in reports if r.aggregation_failed]}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _row(sites: int, dropout: float, codec: str, plain: dict, secure: dict,
         local_steps: int) -> dict:
    dense = plain["dense_fp32_bytes"] or secure["dense_fp32_bytes"]
    return {"sites": sites, "dropout": dropout, "codec": codec, "local_steps": local_steps,
            "partition": "dirichlet-0.5" if sites <= DIRICHLET_SITES else "iid",
            "round_seconds_plain": plain["round_seconds"],
            "round_seconds_secagg": secure["round_seconds"],
            "bytes_up_plain": plain["bytes_up"], "bytes_up_secagg": secure["bytes_up"],
            "sum_exact": secure["sum_exact"], "metric_plain": plain["metric"],
            "metric_secagg": secure["metric"],
            "time_ratio": _ratio(secure["round_seconds"], plain["round_seconds"]),
            "bytes_ratio_to_plain": _ratio(secure["bytes_up"], plain["bytes_up"]),
            "bytes_ratio_to_dense_fp32": _ratio(secure["bytes_up"], dense),
            "dropouts": round(dropout * sites), "failed_secagg": secure["failed"],
            "dense_fp32_bytes": dense, "rounds_unmasked": secure["rounds_unmasked"],
            "dropped_secagg": secure["dropped"],
            "aggregation_failed_secagg": secure["aggregation_failed"]}


def timing(sites: int, pairs: int, rounds: int, local_steps: int, workdir: Path) -> dict:
    """Round seconds of plain and SecAgg+ federations run in alternation (``pairs`` of each,
    the machine's load drifting alike over both): the median round of each arm, their ratio."""
    seconds: dict[str, list[float]] = {"plain": [], "secagg": []}
    for _ in range(pairs):
        for arm_name in seconds:
            seconds[arm_name].append(run_arm(sites, 0.0, 0, rounds, local_steps,
                                             arm_name == "secagg", "none",
                                             workdir)["round_seconds"])
    medians = {k: statistics.median(v) for k, v in seconds.items()}
    return {"sites": sites, "pairs": pairs, "rounds": rounds, "local_steps": local_steps,
            "round_seconds": seconds, "median_plain": medians["plain"],
            "median_secagg": medians["secagg"],
            "ratio": medians["secagg"] / medians["plain"]}


def _mean_sd(values: list) -> dict:
    """Mean and sd (:mod:`stats`) of the defined values, and those values."""
    values = defined(values)
    return dict(zip(("mean", "sd"), mean_sd(values), strict=True), values=values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fedmed_bench_secagg"))
    parser.add_argument("--quick", action="store_true", help="the test's tiny grid")
    parser.add_argument("--accuracy", action="store_true",
                        help="also the convergence comparison at 10 sites over 3 seeds")
    parser.add_argument("--timing-only", action="store_true",
                        help="only the alternating timing, into the report at --output")
    args = parser.parse_args(argv)
    grid = QUICK if args.quick else GRID
    if args.timing_only:
        report = json.loads(args.output.read_text())
        report["timing"] = timing(grid["timing_sites"], grid["timing_pairs"],
                                  grid["timing_rounds"], grid["local_steps"], args.workdir)
        write_report(args.output, report)
        print(report["timing"])
        return 0
    arm = {"rounds": grid["rounds"], "local_steps": grid["local_steps"], "seed": 0,
           "workdir": args.workdir}
    runs = []
    for sites in grid["sites"]:  # a discarded warm-up first: the sites' data loads once
        run_arm(sites, 0.0, 0, 1, 1, secure=False, codec="none", workdir=args.workdir)
        plain = run_arm(sites, 0.0, secure=False, codec="none", **arm)
        for dropout in grid["dropouts"]:
            secure = run_arm(sites, dropout, secure=True, codec="none", **arm)
            runs.append(_row(sites, dropout, "none", plain, secure, grid["local_steps"]))
            print(runs[-1], flush=True)
    sites, codec = grid["randk_sites"], grid["randk"]
    runs.append(_row(sites, 0.0, codec, run_arm(sites, 0.0, secure=False, codec=codec, **arm),
                     run_arm(sites, 0.0, secure=True, codec=codec, **arm), grid["local_steps"]))
    # the same sites with more local work per round: the protocol's cost amortised
    arm["local_steps"] = grid["long_steps"]
    runs.append(_row(sites, 0.0, "none", run_arm(sites, 0.0, secure=False, codec="none", **arm),
                     run_arm(sites, 0.0, secure=True, codec="none", **arm), arm["local_steps"]))
    report_timing = timing(grid["timing_sites"], grid["timing_pairs"], grid["timing_rounds"],
                           grid["local_steps"], args.workdir)
    print(report_timing, flush=True)
    report = {"environment": environment(), "timing": report_timing, "grid": {k: list(v) if isinstance(v, tuple)
                                                     else v for k, v in grid.items()},
              "settings": SETTINGS, "runs": runs}
    if args.accuracy or args.quick:
        sites = 10 if not args.quick else grid["sites"][0]
        metrics = {arm_name: [run_arm(sites, 0.0, seed, grid["accuracy_rounds"],
                                      grid["local_steps"], arm_name == "secagg", "none",
                                      args.workdir)["metric"] for seed in grid["seeds"]]
                   for arm_name in ("plain", "secagg")}
        report["accuracy"] = {"sites": sites, "rounds": grid["accuracy_rounds"],
                              **{k: _mean_sd(v) for k, v in metrics.items()}}
    write_report(args.output, report)
    print_table("SecAgg+ vs plain (PneumoniaMNIST, in-process engine)", [
        Column("sites", ">5", lambda r: r["sites"]),
        Column("dropout", ">7.1f", lambda r: r["dropout"]),
        Column("codec", "<10", lambda r: r["codec"]),
        Column("time x", ">7", lambda r: f"{r['time_ratio'] or float('nan'):.2f}"),
        Column("up/fp32", ">8.3f", lambda r: r["bytes_ratio_to_dense_fp32"] or 0.0),
        Column("exact", "<6", lambda r: str(r["sum_exact"])),
        Column("auc plain", ">9", lambda r: f"{r['metric_plain'] or float('nan'):.4f}"),
        Column("auc secagg", ">10", lambda r: f"{r['metric_secagg'] or float('nan'):.4f}")],
        runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
