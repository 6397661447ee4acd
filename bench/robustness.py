"""Attack table: one bad site against the product's defaults, at 2, 3 and 10 sites (#12, #27, #29).

A benchmark run is a configuration: site folders written by the product's
converter (``python -m clients.datagen shared``: PneumoniaMNIST over Dirichlet(0.5)
sites, or the PE stand-in, MSD lung-tumour patches over iid sites), the product's
run config with **no roster and the product's defaults** (``defence: "default"``: the
run config names neither ``strategy.defence`` nor ``strategy.aggregator``) and the
in-process engine (:func:`app.engine.run_federation`: the real ServerApp against the
real ClientApp at every site). The smallest site attacks from round 1 on, as a site
of the engine (:mod:`app.engine.attacks`); the rows, attacks and targets are in
:mod:`robustness_rows`.

Metric: the product's validation metric of the final global model (``val-auc``
for PneumoniaMNIST, ``val-dice`` for PE: the last round's per-site values,
example-weighted over the honest sites' held-out validation splits; the attacker's
own split is left out, so a refused update and a failing site score alike; higher is
better), the mean over the seeds with its ``sd``; ``relative_to_clean`` = metric /
the row's ``baseline`` (over the seeds both have). ``best_metric``: the same of the
round the product selected as best (the model it registers ``<experiment>-best``).
A run whose model has no finite metric has ``metric`` null.

Every finished run is kept in ``--checkpoint`` at once (a rerun resumes); the
report merges its sets into ``--output``, replacing only those sets (a set with
some runs missing is reported with the seeds it has).

    .venv/bin/python bench/robustness.py                   # -> bench/results/robustness.json
    .venv/bin/python bench/robustness.py --sets pneumoniamnist-2sites --seeds 0
    .venv/bin/python bench/robustness.py --quick --output /tmp/r.json   # the test
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import BENCH  # noqa: I001

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
from collections.abc import Collection, Mapping  # noqa: E402
from pathlib import Path  # noqa: E402

from engine_runs import DATA, run_product  # noqa: E402
from report import Column, environment, print_table, write_report  # noqa: E402
from robustness_rows import (ATTACKS, DATA_SETS, ROWS, Row, federation_sites,  # noqa: E402
                             row_overrides, rows_of)
from stats import at_least, mean, sd  # noqa: E402

__all__ = ["QUICK", "SETS", "honest_metric", "main", "merge_report"]

DEFAULT_OUTPUT = BENCH / "results" / "robustness.json"
DEFAULT_CHECKPOINT = Path("/tmp/fedmed_robustness_29_checkpoint.json")
SEEDS = (0, 1, 2)
SETS: dict[str, dict] = {f"{name}-{n}sites": {"data": name, "sites": n, "rounds": 4,
                                              "local_steps": 10, "rows": rows_of(data)}
                         for name, data in DATA_SETS.items() for n in (2, 3, 10)}
QUICK: dict[str, dict] = {
    "pneumoniamnist-quick": {"data": "pneumoniamnist", "sites": 3, "rounds": 1,
                             "local_steps": 2, "rows": ["none/none", "default/none",
                                                        "default/scaled", "none/scaled"]},
}
#: Rows only the quick test runs (the undefended x1000: the defence must matter).
_EXTRA_ROWS = {"none/scaled": Row("scaled", defence="none", baseline="none/none")}


def _row(name: str) -> Row:
    return ROWS.get(name) or _EXTRA_ROWS[name]


def honest_metric(final: Mapping[str, list], honest: Collection[str]) -> float | None:
    """Example-weighted metric over the ``honest`` sites' ``[value, examples]`` in ``final``
    (any other site, the attacker, left out; a site that sent no value, e.g. an AUC
    undefined on a one-class split, too); ``None`` if none has one or one is not finite."""
    pairs = [(value, n) for site, (value, n) in final.items()
             if site in honest and n and value is not None]
    if not pairs or any(not math.isfinite(v) for v, _ in pairs):
        return None
    return float(sum(v * n for v, n in pairs) / sum(n for _, n in pairs))


def run_one(setup: dict, row_name: str, seed: int, workdir: Path, root: Path) -> dict:
    """One federation of the product; its final and best metric and what the server dropped."""
    data, row = DATA_SETS[setup["data"]], _row(row_name)
    sites, attacker, honest = federation_sites(data, setup["sites"], seed,
                                               ATTACKS[row.attack], root)
    key = f"val-{data.metric}"
    outcome, wall = run_product({
        "task": data.task, **data.settings, "num-server-rounds": setup["rounds"],
        "local-steps": setup["local_steps"], "min-nodes": setup["sites"], "seed": seed,
        "node-wait-timeout": 10.0, "experiment": "bench-robustness",
        **row_overrides(row, data)}, sites, workdir)
    reports = [outcome.reports[r] for r in sorted(outcome.reports)]

    def per_site(report) -> dict:
        return {site: [m.get(key), m.get("num-examples", 0.0)]
                for site, m in report.evaluate.items()}

    final = per_site(reports[-1])
    best = outcome.reports.get(outcome.best_round)
    dropped = [r.train_dropped for r in reports]
    evaluate_dropped = [r.evaluate_dropped for r in reports]
    return {"metric": honest_metric(final, honest), "final_site_metric": final,
            "best_round": outcome.best_round,
            "best_metric": honest_metric(per_site(best), honest) if best else None,
            "metric_per_round": [r.evaluate_aggregate.get(key) for r in reports],
            "attacker": attacker, "wall_s": wall,
            "attacker_dropped_rounds": sum(any(s not in honest for s in d) for d in dropped),
            "attacker_evaluate_dropped_rounds": sum(any(s not in honest for s in d)
                                                    for d in evaluate_dropped),
            "drop_reasons": sorted({reason[:200] for d in dropped + evaluate_dropped
                                    for s, reason in d.items() if s not in honest}),
            "aggregation_failed_rounds": sum(bool(r.aggregation_failed) for r in reports),
            "mlflow_run_id": outcome.mlflow_run_id}


def _key(name: str, row: str, seed: int) -> str:
    return f"{name}|{row}|{seed}"


def run_sets(names: list[str], table: dict, seeds: tuple[int, ...], checkpoint: Path,
             workdir: Path, root: Path) -> dict:
    """Every (set, seed, row) not in ``checkpoint`` yet, a data set's seeds in turn; the
    checkpoint (written after each run)."""
    done = json.loads(checkpoint.read_text()) if checkpoint.is_file() else {}
    for data in dict.fromkeys(table[n]["data"] for n in names):
        for seed in seeds:
            for name in (n for n in names if table[n]["data"] == data):
                for row in table[name]["rows"]:
                    key = _key(name, row, seed)
                    if key in done:
                        continue
                    done[key] = run_one(table[name], row, seed, workdir, root)
                    print(f"{key}: {done[key]['metric']} ({done[key]['wall_s']:.0f} s)",
                          flush=True)
                    checkpoint.write_text(json.dumps(done, indent=1))
    return done


def report_set(name: str, setup: dict, seeds: tuple[int, ...], done: dict) -> dict:
    """The set's rows (mean over the seeds finished) and its ``sets`` entry."""
    data = DATA_SETS[setup["data"]]
    results = {row: {s: done[_key(name, row, s)] for s in seeds if _key(name, row, s) in done}
               for row in setup["rows"]}
    runs = []
    for row_name, per_seed in results.items():
        if not per_seed:
            continue
        row = _row(row_name)
        metrics = [r["metric"] for r in per_seed.values()]
        base = results.get(row.baseline, {}) if row.baseline else per_seed  # itself: 1.0
        common = [s for s in per_seed if s in base]
        mine = mean([per_seed[s]["metric"] for s in common])
        theirs = mean([base[s]["metric"] for s in common])
        relative = mine / theirs if mine is not None and theirs else None
        best_mine = mean([per_seed[s]["best_metric"] for s in common])
        best_theirs = mean([base[s]["best_metric"] for s in common])
        runs.append({
            "set": name, "sites": setup["sites"], "attack": row.attack, "defence": row.defence,
            "aggregator": row.aggregator, "row": row_name, "baseline": row.baseline,
            "seeds": sorted(per_seed), "metric": mean(metrics), "sd": sd(metrics),
            "metric_per_seed": metrics, "relative_to_clean": relative,
            "target": row.target, "within_target": (None if row.target is None
                                                    else at_least(relative, row.target)),
            "best_metric": mean([r["best_metric"] for r in per_seed.values()]),
            "best_relative_to_clean": (best_mine / best_theirs if best_mine is not None
                                       and best_theirs else None),
            "wall_s": mean([r["wall_s"] for r in per_seed.values()]),
            **{k: [r[k] for r in per_seed.values()]
               for k in ("best_round", "attacker", "attacker_dropped_rounds",
                         "attacker_evaluate_dropped_rounds", "drop_reasons",
                         "aggregation_failed_rounds", "metric_per_round",
                         "final_site_metric")}})
    clean = next((r["metric"] for r in runs if r["row"] == "default/none"), None)
    entry = {"description": f"{data.description}; {setup['sites']} sites by clients.datagen "
                            "shared; the attacker is the smallest site; no roster",
             "metric_name": f"val-{data.metric} of the final global model, example-weighted "
                            "over the honest sites' validation splits",
             "direction": "higher is better", "engine": "in-process",
             "setup": {**setup, "seeds": list(seeds), "task": data.task, **data.settings},
             "target": {"attack_relative_at_least": 0.98, "clean_relative_at_least": 0.99}}
    return {"clean": clean, "runs": runs, "entry": entry}


def merge_report(path: Path, report: dict) -> dict:
    """Write ``report`` into the JSON at ``path``, replacing only its own sets.

    The file keeps ``{"clean": {set: metric}, "runs": [...], "sets": {set: {...}},
    "engine": ..., "environment": ...}``; the sets in ``report`` replace those of
    the same names, other sets stay. A run without ``sites`` (an older set's) gets
    its set's ``setup["sites"]``. Returns what was written (strict JSON: no NaN).
    """
    path = Path(path)
    merged = json.loads(path.read_text()) if path.is_file() else {}
    names = set(report["clean"])
    merged["clean"] = {**{k: v for k, v in merged.get("clean", {}).items() if k not in names},
                       **report["clean"]}
    merged["runs"] = [r for r in merged.get("runs", []) if r["set"] not in names] + report["runs"]
    merged["sets"] = {**{k: v for k, v in merged.get("sets", {}).items() if k not in names},
                      **report["sets"]}
    for run in merged["runs"]:
        sites = merged["sets"].get(run["set"], {}).get("setup", {}).get("sites")
        if "sites" not in run and sites is not None:
            run["sites"] = sites
    merged.update({k: v for k, v in report.items() if k not in ("clean", "runs", "sets")})
    write_report(path, merged, allow_nan=False)
    return merged


def _table(name: str, result: dict) -> None:
    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    columns = [Column("row", "<26", lambda r: r["row"]),
               Column("metric", ">8", lambda r: cell(r["metric"])),
               Column("sd", ">7", lambda r: cell(r["sd"])),
               Column("/ baseline", ">10", lambda r: cell(r["relative_to_clean"])),
               Column("best /", ">7", lambda r: cell(r["best_relative_to_clean"])),
               Column("seeds", ">6", lambda r: len(r["seeds"])),
               Column("s/run", ">6", lambda r: f"{r['wall_s']:.0f}")]
    print_table(f"{name} (clean, defaults: {cell(result['clean'])})", columns, result["runs"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=None, help=f"default: {list(SETS)}")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--quick", action="store_true", help="one tiny set (the test)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON to merge into")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help=f"finished runs (default {DEFAULT_CHECKPOINT}; --quick: fresh)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fedmed_robustness"),
                        help="MLflow store of the runs")
    parser.add_argument("--data", type=Path, default=DATA, help="where the site folders go")
    parser.add_argument("--report-only", action="store_true",
                        help="merge what the checkpoint holds, run nothing")
    args = parser.parse_args(argv)
    table = QUICK if args.quick else SETS
    seeds = (0,) if args.quick else tuple(args.seeds)
    names = args.sets or list(table)
    checkpoint = args.checkpoint or (args.workdir / "quick-checkpoint.json" if args.quick
                                     else DEFAULT_CHECKPOINT)
    if args.quick:
        checkpoint.unlink(missing_ok=True)
    done = (json.loads(checkpoint.read_text()) if args.report_only and checkpoint.is_file()
            else {} if args.report_only
            else run_sets(names, table, seeds, checkpoint, args.workdir, args.data))
    report = {"clean": {}, "runs": [], "sets": {}, "engine": "in-process",
              "environment": environment()}
    for name in names:
        result = report_set(name, table[name], seeds, done)
        if not result["runs"]:
            continue
        report["clean"][name] = result["clean"]
        report["runs"] += result["runs"]
        report["sets"][name] = result["entry"]
        _table(name, result)
    merge_report(args.output, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
