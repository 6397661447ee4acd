"""Server optimizers, SCAFFOLD, FedProx and FedNova vs FedAvg, pooled and local-only training.

Issue 34, item 3, as a configuration of the product: each method is a run
config (:mod:`server_optimizer_methods`) run by the in-process engine on site
folders written by the product's converter (:mod:`server_optimizer_sets`).
Methods: ``fedavg``, ``fedavgm`` / ``fedadam`` / ``fedyogi``
(``strategy.server-opt``), ``fedprox`` (``proximal-mu``), ``fednova``
(``strategy.aggregator``), ``scaffold``, ``pooled`` (centralised, the same
total local steps) and ``local-only``; a method whose run-config key the
product does not declare yet is left out of the default list and refused
when asked for, naming the key.

Protocol: per set and method, a grid of the sites' lr (the set's) x the method's knob
runs with seed 0 and the setting with the best validation metric (mean of the
last ``--tail`` rounds, site-averaged) is chosen on validation data only; it
then runs with ``--seeds`` seeds (seed 0's run is the tuning run). The
reported metric is the unweighted mean over the sites of each site's ``test``
split metric (FLamby averages its per-centre test metrics the same way),
after the last round; ``rounds_to_target``: the first round reaching
``--fraction`` of pooled's final metric (:mod:`server_optimizer_summary`).
A seed fixes the initial model and every batch; the data split is fixed
(converter seed 0). Usage::

    python bench/server_optimizers.py                       # heart-disease, 5 seeds
    python bench/server_optimizers.py --sets pneumoniamnist --methods fedavg pooled
    python bench/server_optimizers.py --quick --sets msd-lung   # wiring check
    python bench/server_optimizers.py --merge other.json        # sets run elsewhere
    python bench/server_optimizers.py --sets msd-lung --extend --seeds 5  # 2 more seeds

Writes ``--output`` (default ``bench/results/server_optimizers.json``) after
every method; it keeps the sets and methods a run does not measure (measured
with the same set settings).
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import ROOT  # noqa: I001

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict  # noqa: E402
from pathlib import Path  # noqa: E402

from report import Column, environment, print_table, write_report  # noqa: E402
from server_optimizer_methods import METHODS, run_method, settings_grid, unavailable  # noqa: E402
from server_optimizer_sets import SETS, BenchSet, build_folders, shortened  # noqa: E402
from server_optimizer_summary import choose, goals, summarise, val_score  # noqa: E402
from stats import pm  # noqa: E402

__all__ = ["available_methods", "merge", "main"]

DEFAULT_OUTPUT = ROOT / "bench" / "results" / "server_optimizers.json"


def available_methods() -> tuple[list[str], dict[str, str]]:
    """The methods the product can run now, and why each other one cannot."""
    reasons = {name: unavailable(name) for name in METHODS}
    return [m for m, r in reasons.items() if r is None], {m: r for m, r in reasons.items() if r}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sets", nargs="+", default=["heart-disease"], choices=list(SETS))
    p.add_argument("--methods", nargs="+", default=None,
                   help="default: every method whose run-config keys the product declares")
    p.add_argument("--seeds", type=int, default=None,
                   help="seeds 0 .. seeds-1 (0 also tunes); default 5, --quick 1")
    p.add_argument("--lrs", type=float, nargs="+", default=[],
                   help="sites' lr grid (default: the set's, server_optimizer_sets.SETS)")
    p.add_argument("--rounds", type=int, default=0, help="0: the set's")
    p.add_argument("--steps", type=int, default=0, help="local steps a round (0: the set's)")
    p.add_argument("--sites", type=int, default=0, help="0: the set's (heart-disease: 4)")
    p.add_argument("--max-per-site", type=int, default=0, help="items per site (0: all)")
    p.add_argument("--fraction", type=float, default=0.95, help="target: this x pooled's final")
    p.add_argument("--tail", type=int, default=3, help="rounds of the validation score")
    p.add_argument("--quick", action="store_true", help="wiring check: 2 rounds of 2 steps, "
                   "2 sites (heart-disease: 4) of at most 16 items, one lr, one seed")
    p.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    p.add_argument("--workdir", type=Path, default=None, help="default: a temporary folder")
    p.add_argument("--extend", action="store_true",
                   help="keep each method's tuning choice and seeds in --output (same set "
                   "settings) and run only the seeds 0 .. seeds-1 it lacks")
    p.add_argument("--merge", type=Path, nargs="+", default=None, metavar="FILE",
                   help="run nothing: fold the sets measured in FILEs (e.g. sets run in "
                   "parallel processes, same protocol) into --output")
    return p


def _methods(parser: argparse.ArgumentParser, asked: list[str] | None) -> list[str]:
    """The methods to run: ``asked`` (each known and available, else the parser's error
    naming it) or every available one."""
    ready, reasons = available_methods()
    if asked is None:
        return ready
    for name in asked:
        if name not in METHODS:
            parser.error(f"unknown method {name!r} (known: {', '.join(METHODS)})")
        if name in reasons:
            parser.error(f"method {name!r} cannot run: {reasons[name]}")
    return list(dict.fromkeys(asked))


def _kept(output: Path, sets: dict[str, dict], running: set[tuple[str, str]],
          protocol: dict) -> dict:
    """What ``output`` holds that this run keeps: records of sets measured with the same
    settings (or not measured now), less the (set, method) pairs in ``running``.

    Raises
    ------
    ValueError
        If ``output`` was measured under another ``protocol`` (the message names the file).
    """
    old = json.loads(output.read_text()) if output.is_file() else {}
    if old and old.get("protocol") != protocol:
        raise ValueError(f"{output} holds runs measured under another protocol "
                         f"({old.get('protocol')}); write to another --output")
    same = {n for n, s in old.get("sets", {}).items() if sets.get(n, s) == s}

    def keep(r: dict) -> bool:
        return r["set"] in same and (r["set"], r["method"]) not in running

    return {"sets": {n: s for n, s in old.get("sets", {}).items() if n in same},
            "per_seed": [r for r in old.get("per_seed", []) if keep(r)],
            "tuning": [r for r in old.get("tuning", []) if keep(r)],
            "commands": old.get("commands", [])}


def merge(output: Path, files: list[Path], fraction: float) -> dict:
    """``output`` with every set measured in ``files`` folded in (a set a file measured
    replaces the records ``output`` or an earlier file held for it); the summary recomputed.

    Raises
    ------
    ValueError
        If the files were measured under different protocols (the message names them).
    """
    payloads = [(f, json.loads(f.read_text())) for f in [output, *files] if f.is_file()]
    if not payloads:
        raise ValueError(f"nothing to merge: none of {[str(f) for f in files]} exists")
    first, merged = payloads[0]
    for path, payload in payloads[1:]:
        if payload.get("protocol") != merged.get("protocol"):
            raise ValueError(f"{path} was measured under another protocol than {first}; "
                             "merge only runs of the same protocol")
        for part in ("per_seed", "tuning"):
            merged[part] = [r for r in merged.get(part, []) if r["set"] not in payload["sets"]]
            merged[part] += payload.get(part, [])
        merged["sets"] = {**merged.get("sets", {}), **payload["sets"]}
        merged["skipped"] = merged.get("skipped", []) + payload.get("skipped", [])
        merged["commands"] = list(dict.fromkeys(merged.get("commands", [])
                                                + payload.get("commands", [])))
    merged["runs"] = [row for name in merged["sets"] for row in summarise(
        name, merged["sets"][name]["metric"], merged["per_seed"], fraction)]
    merged["goals"] = goals(merged["runs"])
    return merged


def _earlier(payload: dict, set_name: str, method: str) -> dict | None:
    """The setting ``payload`` holds as tuned for ``method`` on ``set_name`` (``--extend``),
    with its tuning seed measured; else ``None`` (it is tuned again)."""
    tuned = [t["chosen"] for t in payload["tuning"]
             if (t["set"], t["method"]) == (set_name, method)]
    seeds = {r["seed"] for r in payload["per_seed"] if (r["set"], r["method"]) == (set_name,
                                                                               method)}
    return {"setting": tuned[-1]} if tuned and 0 in seeds else None


def _tune(bench_set: BenchSet, folders, name: str, args: argparse.Namespace, payload: dict,
          work: Path) -> dict:
    """Run ``name``'s settings grid with the tuning seed; record the trials and return the
    chosen trial (its ``setting`` and seed 0's curves)."""
    trials = []
    for setting in settings_grid(METHODS[name], bench_set.lrs):
        curves = run_method(bench_set, folders, name, setting, 0, work)
        trials.append({"setting": setting, "val": curves.val, "test": curves.test,
                       "seconds": curves.seconds})
        print(f"[{bench_set.name}] tune {name} {setting}: val "
              f"{val_score(curves.val, args.tail)} ({curves.seconds:.0f} s)", flush=True)
    chosen = choose(trials, args.tail)
    payload["tuning"].append({
        "set": bench_set.name, "method": name, "seed": 0, "chosen": chosen["setting"],
        "trials": [{"setting": t["setting"], "val_score": val_score(t["val"], args.tail),
                    "val": t["val"]} for t in trials]})
    return chosen


def _measure(bench_set: BenchSet, methods: list[str], args: argparse.Namespace, payload: dict,
             tmp: Path) -> None:
    """Tune and run every method of ``methods`` on ``bench_set``; the output after each."""
    folders = build_folders(bench_set, args.shared, tmp / bench_set.name / "folders")
    work = args.workdir or tmp / bench_set.name / "runs"
    for name in methods:
        earlier = _earlier(payload, bench_set.name, name) if args.extend else None
        chosen = earlier or _tune(bench_set, folders, name, args, payload, work)
        done = {r["seed"] for r in payload["per_seed"]
                if (r["set"], r["method"]) == (bench_set.name, name)}
        records = [] if earlier else [{"set": bench_set.name, "method": name, "seed": 0,
                                       **chosen}]
        for seed in range(1, args.seeds):
            if seed in done:
                continue
            curves = run_method(bench_set, folders, name, chosen["setting"], seed, work)
            records.append({"set": bench_set.name, "method": name, "seed": seed,
                            "setting": chosen["setting"], "val": curves.val,
                            "test": curves.test, "seconds": curves.seconds})
        payload["per_seed"] += records
        print(f"[{bench_set.name}] {name} {chosen['setting']}: test "
              f"{[round(r['test'][-1], 4) for r in records if r['test'][-1] is not None]}",
              flush=True)
        _write(payload, args)


def _write(payload: dict, args: argparse.Namespace) -> None:
    """The summary rows and goals of ``payload``'s records, then ``payload`` to ``--output``."""
    payload["runs"] = [row for name in payload["sets"] for row in summarise(
        name, payload["sets"][name]["metric"], payload["per_seed"], args.fraction)]
    payload["goals"] = goals(payload["runs"])
    write_report(args.output, payload, indent=1, allow_nan=False)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.merge:
        try:
            write_report(args.output, merge(args.output, args.merge, args.fraction), indent=1,
                         allow_nan=False)
        except ValueError as exc:
            parser.error(str(exc))
        return 0
    methods = _methods(parser, args.methods)
    args.seeds = args.seeds or (1 if args.quick else 5)
    if args.quick:
        args.rounds, args.steps = args.rounds or 2, args.steps or 2
        args.sites, args.max_per_site = args.sites or 2, args.max_per_site or 16
    sets = [shortened(SETS[n], args.rounds, args.steps, args.sites, args.max_per_site,
                      tuple(args.lrs) or SETS[n].lrs[:1 if args.quick else None])
            for n in args.sets]
    records = json.loads(json.dumps({s.name: asdict(s) for s in sets}))  # as the file holds them
    protocol = {"fraction": args.fraction, "tail": args.tail, "tuning_seed": 0,
                "optimizer": "sgd", "momentum": 0.0,
                "metric_average": "unweighted mean over sites of each site's test split",
                "quick": args.quick}
    try:
        running = set() if args.extend else {(s.name, m) for s in sets for m in methods}
        kept = _kept(args.output, records, running, protocol)
    except ValueError as exc:
        parser.error(str(exc))
    started = time.perf_counter()
    payload = {
        "description": __doc__.split("\n\n")[0], "engine": "in-process", "protocol": protocol,
        "sets": {**kept["sets"], **records}, "runs": [], "goals": {},
        "tuning": kept["tuning"], "per_seed": kept["per_seed"], "skipped": [],
        "unavailable": available_methods()[1],
        "commands": kept["commands"] + [" ".join(["python", "bench/server_optimizers.py",
                                                  *(sys.argv[1:] if argv is None else argv)])],
        "machine": {**environment(), "device": "cpu"}}
    with tempfile.TemporaryDirectory(prefix="server-optimizers-") as tmp:
        for bench_set in sets:
            if not (args.shared / bench_set.shared_file).is_file():
                payload["skipped"].append({"set": bench_set.name, "reason": f"no "
                                           f"{args.shared / bench_set.shared_file}"})
                del payload["sets"][bench_set.name]
                continue
            _measure(bench_set, methods, args, payload, Path(tmp))
    payload["wall_seconds"] = time.perf_counter() - started
    _write(payload, args)
    print_table("final test metric (mean +- sd over seeds), rounds to target", [
        Column("set", "<15", lambda r: r["set"]), Column("method", "<11", lambda r: r["method"]),
        Column("metric", "<9", lambda r: r["metric"]),
        Column("final", "7.4f", lambda r: r["final_metric"]),
        Column("sd", ">6", lambda r: pm(r["sd"], None, ".4f")),
        Column("to target", ">9", lambda r: pm(r["rounds_to_target"], None, ".1f", "never")),
        Column("seeds", "5d", lambda r: r["seeds"])], payload["runs"])
    for name, goal in payload["goals"].items():
        print(f"{name}: best federated {goal['best_federated']}, gap closed {goal['gap_closed']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
