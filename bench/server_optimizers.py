"""Server optimizers, SCAFFOLD, FedProx and FedNova vs FedAvg, pooled and local-only training.

Issue 34, item 3: FedAvg's server step against FedAvgM, FedAdam and FedYogi (Reddi et
al., "Adaptive Federated Optimization", ICLR 2021), FedProx, FedNova and SCAFFOLD, each a
run config of the product (:data:`METHODS`, plain SGD at the sites) through the in-process
engine on the folders of :mod:`server_optimizer_sets`; ``pooled`` is one site with every
site's items (``K x tau`` steps a round), ``local-only`` one run per site. Per set and
method the sites' lr grid x the method's knobs runs with seed 0, the best validation score
(last ``--tail`` rounds, site-averaged ``val``) chooses the setting the other ``--seeds``
run; reported: the unweighted mean over the sites of each site's ``test`` metric after the
last round (as FLamby), rounds to ``--fraction`` of pooled's, and the goal: the best
federated method closes half the FedAvg-pooled gap. :mod:`runner`'s command line, its own
loop (:func:`run`: pooled and local-only are no federation of a set's sites, later seeds
run seed 0's choice); ``--resume`` keeps the runs of the same set settings, method,
setting and seed, the tuning trials included. Usage::

    python bench/server_optimizers.py                       # heart-disease, 5 seeds
    python bench/server_optimizers.py --sets pneumoniamnist --resume
    python bench/server_optimizers.py --quick --sets msd-lung   # wiring check
    python bench/server_optimizers.py --sets msd-lung --resume --seeds 0 1 2 3 4
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import BENCH  # noqa: I001

import argparse  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import runner  # noqa: E402
from engine_runs import run_product  # noqa: E402
from federation_sites import folder_sites  # noqa: E402
from report import Column, environment, print_table, write_report  # noqa: E402
from runner import Option  # noqa: E402
from server_optimizer_sets import SETS, BenchSet, Folders, build_folders, shortened  # noqa: E402
from stats import defined, group, mean, mean_sd, pm  # noqa: E402

__all__ = ["Method", "METHODS", "STUDY", "settings_grid", "unavailable", "run_method",
           "val_score", "choose", "summarise", "goals", "rows_of", "table", "run", "main"]


@dataclass(frozen=True)
class Method:
    """A method: its fixed run-config keys, its knobs' grid (beside the sites' lr) and regime."""

    keys: dict = field(default_factory=dict)
    grid: dict[str, tuple] = field(default_factory=dict)
    regime: str = "federated"


METHODS: dict[str, Method] = {
    "fedavg": Method(),
    "fedavgm": Method({"strategy.server-opt": "avgm"}, {"server-opt.momentum": (0.5, 0.9)}),
    "fedadam": Method({"strategy.server-opt": "adam"}, {"server-opt.eta": (0.01, 0.1)}),
    "fedyogi": Method({"strategy.server-opt": "yogi"}, {"server-opt.eta": (0.01, 0.1)}),
    "fedprox": Method({}, {"proximal-mu": (0.1, 1.0)}),
    # FedNova's server momentum (Wang et al. 2020, Sec. 5) is FedAvgM's step with eta 1
    # (#45); momentum 0 is plain FedNova, x - Delta.
    "fednova": Method({"strategy.aggregator": "fednova", "strategy.server-opt": "avgm"},
                      {"server-opt.momentum": (0.0, 0.5)}),
    "scaffold": Method({"strategy.control-variates": "scaffold"}),
    "pooled": Method(regime="pooled"),
    "local-only": Method(regime="local"),
}
SGD = {"optimizer": "sgd", "momentum": 0.0}


def settings_grid(method: Method, lrs: Sequence[float] = (0.1,)) -> list[dict]:
    """Every tuned setting of ``method``: ``lr`` x its knobs, each a dict of run-config keys."""
    names = ["lr", *method.grid]
    return [dict(zip(names, values)) for values in itertools.product(lrs, *method.grid.values())]


def unavailable() -> dict[str, str]:
    """Why the product refuses each method it cannot run (a run-config key or value it lacks)."""
    from app.engine import full_run_config  # noqa: PLC0415 - the engine loads Flower
    from strategies.wire.errors import ConfigError  # noqa: PLC0415

    reasons = {}
    for name, method in METHODS.items():
        try:
            for setting in settings_grid(method):
                full_run_config({**SGD, **method.keys, **setting})
        except ConfigError as exc:
            reasons[name] = str(exc)
    return reasons


def run_method(bench_set: BenchSet, folders: Folders, name: str, setting: dict, seed: int,
               workdir: Path) -> dict:
    """One run of ``name`` with ``setting`` and ``seed`` (local-only: a federation per site):
    per round the site-averaged ``val`` and ``test`` metric, and its wall seconds. Raises
    RuntimeError if a round accepted no train reply of the training sites."""
    method, sites, tests = METHODS[name], list(folders.sites), list(folders.tests)
    tau = bench_set.steps * (len(sites) if method.regime == "pooled" else 1)
    runs = {"local": [([s], [s, t]) for s, t in zip(sites, tests)],
            "pooled": [([folders.pooled], [folders.pooled, *sites, *tests])]
            }.get(method.regime, [(sites, sites + tests)])
    state = Path(tempfile.mkdtemp(prefix="state-", dir=workdir))  # fresh site state per run
    curves, seconds = {"val": [], "test": []}, 0.0
    for trained, members in runs:
        config = {"task": bench_set.task, **bench_set.settings, **SGD, **method.keys, **setting,
                  "seed": seed, "local-steps": tau, "num-server-rounds": bench_set.rounds,
                  "min-nodes": len(members), "experiment": f"{STUDY.experiment}-{bench_set.name}"}
        outcome, took = run_product(config, folder_sites(
            members, [s for s in members if s not in trained], state_root=state), workdir)
        for server_round, report in sorted(outcome.reports.items()):
            if not {s.name for s in trained} & set(report.train):
                raise RuntimeError(f"round {server_round}: no train reply of {trained} was "
                                   f"accepted ({report.train_dropped})")
        key = f"val-{bench_set.metric}"
        for part, measured in (("val", folders.sites), ("test", folders.tests)):
            curves[part].append([mean([r.evaluate[s.name][key] for s in members if s in measured
                                       and key in r.evaluate.get(s.name, {})])
                                 for _, r in sorted(outcome.reports.items())])
        seconds += took
    return {**{k: [mean(defined(v)) for v in zip(*c)] for k, c in curves.items()},
            "seconds": seconds}


def val_score(val_curve: Sequence[float | None], tail: int) -> float | None:
    """Mean of the last ``tail`` rounds' defined values of ``val_curve`` (``None``: none)."""
    return mean(defined(val_curve[-tail:]))


def choose(trials: list[dict], tail: int) -> dict:
    """The trial (``{"setting", "val"}``) with the best :func:`val_score`, ties: the first
    (ValueError if none has one)."""
    scored = [(s, -i) for i, t in enumerate(trials) if (s := val_score(t["val"], tail)) is not None]
    if not scored:
        raise ValueError("no tuning run has a validation metric (every round undefined)")
    return trials[-max(scored)[1]]


def summarise(name: str, metric: str, per_seed: list[dict], fraction: float) -> list[dict]:
    """Per method of set ``name`` (:data:`METHODS` order), mean and sd over seeds of the last
    round's test metric, and of the first round at ``fraction`` x pooled's over the seeds
    reaching it (``seeds_at_target``)."""
    runs = [r for r in per_seed if r["set"] == name]
    finals = {m: defined([r["test"][-1] for r in runs if r["method"] == m]) for m in METHODS}
    target = None if (pooled := mean(finals["pooled"])) is None else fraction * pooled
    rows = []
    for method, values in ((m, v) for m, v in finals.items() if v):
        mine = [r for r in runs if r["method"] == method]
        reached = [] if target is None else defined([next(
            (i for i, v in enumerate(r["test"], 1) if v is not None and v >= target), None)
            for r in mine])
        final, sd = mean_sd(values)
        rows.append({"set": name, "method": method, "metric": metric, "final_metric": final,
                     "sd": sd, "seeds": len(values), "seed_values": [r["seed"] for r in mine],
                     "rounds_to_target": mean(reached), "seeds_at_target": len(reached),
                     "target": target, "setting": mine[0]["setting"],
                     "regime": METHODS[method].regime})
    return rows


def goals(rows: list[dict]) -> dict[str, dict]:
    """Per set: FedAvg, pooled, the best federated method and the share of the gap it closes
    (``None`` without both ends or when pooled is not above FedAvg: no gap to close)."""
    out = {}
    for name, mine in group(rows, lambda r: r["set"]).items():
        finals = {r["method"]: r["final_metric"] for r in mine}
        federated = {r["method"]: r["final_metric"] for r in mine if r["regime"] == "federated"}
        best = max(federated, key=federated.get) if federated else None
        gap = None if None in (fedavg := finals.get("fedavg"), pooled := finals.get("pooled")) \
            else pooled - fedavg
        closed = (federated[best] - fedavg) / gap if gap and gap > 0 and best else None
        out[name] = {"fedavg": fedavg, "pooled": pooled, "best_federated": best,
                     "best_metric": federated.get(best), "gap": gap, "gap_closed": closed,
                     "goal_met": None if closed is None else closed >= 0.5,
                     "methods_measured": sorted(finals)}
    return out


def _summary(meta: dict, rows: list[dict], args: argparse.Namespace) -> dict:
    """The JSON: per (set, method) the tuning seed's trials and choice (``tuning``), the
    chosen setting's runs (``per_seed``, in run order), the rows and the goals."""
    tuning, chosen = [], {}
    for (name, method), mine in group(rows, lambda r: (r["set"], r["method"])).items():
        grid = settings_grid(METHODS[method], meta["sets"][name]["lrs"])
        trials = sorted((r for r in mine if r["seed"] == 0), key=lambda r: grid.index(r["setting"]))
        chosen[name, method] = choose(trials, args.tail)["setting"]
        tuning.append({"set": name, "method": method, "seed": 0, "chosen": chosen[name, method],
                       "trials": [{"setting": t["setting"], "val_score": val_score(
                           t["val"], args.tail), "val": t["val"]} for t in trials]})
    per_seed = [r for r in rows if r["setting"] == chosen[r["set"], r["method"]]]
    runs = [row for name, entry in meta["sets"].items()
            for row in summarise(name, entry["metric"], per_seed, args.fraction)]
    return {**meta, "runs": runs, "goals": goals(runs), "tuning": tuning, "per_seed": per_seed}


def rows_of(payload: dict) -> list[dict]:
    """The runs a JSON of this study holds: its per-seed records, then the tuning trials
    that were not chosen (their validation curve only)."""
    return payload.get("per_seed", []) + [
        {"set": t["set"], "method": t["method"], "seed": 0, **trial} for t in
        payload.get("tuning", []) for trial in t["trials"] if trial["setting"] != t["chosen"]]


def table(payload: dict) -> None:
    """Print the final test metric and rounds to target per (set, method), each set's goal."""
    print_table("final test metric (mean +- sd over seeds), rounds to target", [
        Column("set", "<15", lambda r: r["set"]), Column("method", "<11", lambda r: r["method"]),
        Column("metric", "<9", lambda r: r["metric"]),
        Column("final", "7.4f", lambda r: r["final_metric"]),
        Column("sd", ">6", lambda r: pm(r["sd"], None, ".4f")),
        Column("to target", ">9", lambda r: pm(r["rounds_to_target"], None, ".1f", "never")),
        Column("seeds", "5d", lambda r: r["seeds"])], payload["runs"])
    for name, goal in payload["goals"].items():
        print(f"{name}: best federated {goal['best_federated']}, gap closed {goal['gap_closed']}")


def run(args: argparse.Namespace, methods: list[str], command: Sequence[str]) -> dict:
    """Tune and run ``methods`` on the sets of ``args``, writing the JSON after each method;
    the JSON (ValueError: ``--resume`` on an ``--output`` of another protocol)."""
    started = time.perf_counter()
    sets = [shortened(SETS[n], args.rounds, args.steps, args.sites, args.max_per_site,
                      tuple(args.lrs) or SETS[n].lrs[:1 if args.quick else None])
            for n in args.sets]
    measured = json.loads(json.dumps({s.name: asdict(s) for s in sets}))  # as the JSON holds it
    protocol = {"fraction": args.fraction, "tail": args.tail, "tuning_seed": 0, **SGD,
                "metric_average": "unweighted mean over sites of each site's test split",
                "quick": args.quick}
    old = json.loads(args.output.read_text()) if args.resume and args.output.is_file() else {}
    if old and old["protocol"] != protocol:
        raise ValueError(f"{args.output} holds runs measured under another protocol "
                         f"({old['protocol']}); write to another --output")
    kept = {n: s for n, s in old.get("sets", {}).items() if measured.get(n, s) == s}
    rows = [r for r in rows_of(old) if r["set"] in kept]
    meta = {"description": __doc__.split("\n\n")[0], "engine": "in-process", "protocol": protocol,
            "sets": {**kept, **measured}, "runs": [], "goals": {}, "tuning": [], "per_seed": [],
            "skipped": [], "unavailable": unavailable(),  # the keys in the JSON's order
            "commands": [*old.get("commands", []), " ".join(["python", "bench/server_optimizers.py",
                                                             *command])],
            "machine": {**environment(), "device": "cpu"}}
    with tempfile.TemporaryDirectory(prefix="server-optimizers-") as tmp:
        for bench_set in sets:
            if not (args.shared_data / bench_set.shared_file).is_file():
                meta["skipped"].append({"set": bench_set.name, "reason":
                                        f"no {args.shared_data / bench_set.shared_file}"})
                del meta["sets"][bench_set.name]
                continue
            folders = build_folders(bench_set, args.shared_data, Path(tmp) / bench_set.name)
            work = args.workdir or Path(tmp) / bench_set.name / "runs"
            work.mkdir(parents=True, exist_ok=True)
            for name in (m for m in methods if args.budget_seconds is None
                         or time.perf_counter() - started <= args.budget_seconds):
                _measure(bench_set, folders, name, args, rows, work)
                write_report(args.output, _summary(meta, rows, args), indent=1, allow_nan=False)
    meta["wall_seconds"] = time.perf_counter() - started
    payload = _summary(meta, rows, args)
    write_report(args.output, payload, indent=1, allow_nan=False)
    return payload


def _measure(bench_set: BenchSet, folders: Folders, name: str, args: argparse.Namespace,
             rows: list[dict], work: Path) -> None:
    """Method ``name``'s trials with seed 0, then its choice with the other seeds, each run
    ``rows`` lacks (same set, method, setting and seed)."""
    def record(setting: dict, seed: int) -> dict:
        key = (bench_set.name, name, seed, setting)
        done = next((r for r in rows if (r["set"], r["method"], r["seed"], r["setting"]) == key),
                    None)
        if done is None:
            done = {"set": bench_set.name, "method": name, "seed": seed, "setting": setting,
                    **run_method(bench_set, folders, name, setting, seed, work)}
            rows.append(done)
            print(f"[{bench_set.name}] {name} {setting} seed {seed}: {done['test']}", flush=True)
        return done

    trials = [record(setting, 0) for setting in settings_grid(METHODS[name], bench_set.lrs)]
    chosen = choose(trials, args.tail)["setting"]
    for seed in sorted(set(args.seeds) - {0}):
        record(chosen, seed)


STUDY = runner.Study(  # the runner's command line; run() replaces run_study (module docstring)
    name="server_optimizers", doc=__doc__, output=BENCH / "results" / "server_optimizers.json",
    sets=list(SETS), federation=None, arms=None, schedule=None, fields=None, summary=None,
    table=None, rows_of=rows_of, arm_key="method", experiment="bench-server-optimizers",
    defaults={"sets": ["heart-disease"], "seeds": None, "tail": 3},
    options=(
        Option("--methods", {"nargs": "+", "choices": list(METHODS), "help": "default: every "
                             "method whose run-config keys the product declares"}),
        Option("--lrs", {"type": float, "nargs": "+", "default": [], "help": "sites' lr grid"}),
        *(Option(f"--{k}", {"type": int, "default": 0, "help": "0: the set's"})
          for k in ("rounds", "steps", "sites", "max-per-site")),
        Option("--quick", {"action": "store_true", "help": "wiring check: 2 rounds of 2 steps, "
                           "2 sites (heart-disease: 4) of at most 16 items, one lr, seed 0"})))


def main(argv: Sequence[str] | None = None) -> int:
    parser = runner.parser(STUDY)
    args = parser.parse_args(argv)
    if args.table:
        table(json.loads(args.output.read_text()))
        return 0
    reasons = unavailable()
    methods = list(dict.fromkeys(args.methods or [m for m in METHODS if m not in reasons]))
    for name in (m for m in methods if m in reasons):
        parser.error(f"method {name!r} cannot run: {reasons[name]}")
    args.seeds = args.seeds or ([0] if args.quick else list(range(5)))
    if args.quick:
        args.rounds, args.steps = args.rounds or 2, args.steps or 2
        args.sites, args.max_per_site = args.sites or 2, args.max_per_site or 16
    try:
        payload = run(args, methods, sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        parser.error(str(exc))
    table(payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
