"""Attack table: one bad site against the product's defaults, at 2, 3 and 10 sites (#12, #27, #29).

A study of :mod:`runner`: a set is site folders written by the product's converter
(``python -m clients.datagen shared``: PneumoniaMNIST over Dirichlet(0.5) sites, or
the PE stand-in, MSD lung-tumour patches over iid sites, dealt per seed) and the
product's run config with **no roster and the product's defaults** (``defence:
"default"``: the run config names neither ``strategy.defence`` nor
``strategy.aggregator``); an arm is a row (defence, aggregator, attack). The smallest
site (by train count) attacks from round 1 on, as a site of the engine
(:mod:`app.engine.attacks`):

* ``default/none`` against ``none/none`` (``strategy.defence = "none"``): the defaults
  cost at most 1% on a clean federation (target 0.99);
* every attack under the defaults against ``default/none`` (target 0.98);
* the FedNova steps lie against FedNova's own clean run (``strategy.aggregator =
  "fednova"`` with local SGD: FedNova refuses Adam; target 0.98).

The attacks: ``scaled`` (update x1000), ``sign-flip`` (x-1), ``inflated-n``
(``num-examples`` 1e15), ``nan-buffer`` (NaN in the raw normalisation statistics),
``running-var`` (each BatchNorm ``running_var`` update ``k (v + 1)`` with ``k = 2 N /
N_bad``, twice the inverse of the site's example share: the example-weighted mean drives
the global variance to about ``-v - 2``), ``long-name`` (its replies declare a
300-character site name), ``metric-1e6`` (its evaluate replies report the task metric as
1e6), ``steps-lie`` (its FedNova train replies claim 1 step). The PE model has instance
norm (no running statistics): no ``nan-buffer`` / ``running-var`` rows.

Metric: the product's validation metric of the final global model (``val-auc`` for
PneumoniaMNIST, ``val-dice`` for PE: the last round's per-site values, example-weighted
over the honest sites' held-out validation splits; the attacker's own split is left out,
so a refused update and a failing site score alike; higher is better), the mean over the
seeds with its ``sd``; ``relative_to_clean`` = metric / the row's ``baseline`` (over the
seeds both have). ``best_metric``: the same of the round the product selected as best.
A run whose model has no finite metric has ``metric`` null. The report merges its sets
into ``--output``, replacing only those sets; ``seed_runs`` holds every run (``--resume``).

    .venv/bin/python bench/robustness.py --resume          # -> bench/results/robustness.json
    .venv/bin/python bench/robustness.py --sets pneumoniamnist-2sites --seeds 0
    .venv/bin/python bench/robustness.py --quick --output /tmp/r.json   # the test
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import BENCH  # noqa: I001

import argparse  # noqa: E402
import csv  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
from collections.abc import Collection, Mapping  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402

import runner  # noqa: E402
from clients.datagen.federation import hospital_name  # noqa: E402
from engine_runs import DATA, shared_sites  # noqa: E402
from report import Column  # noqa: E402
from stats import at_least, mean, sd  # noqa: E402

__all__ = ["QUICK", "SETS", "STUDY", "honest_metric", "merged", "report_set"]

#: ``SiteAttack`` keywords of the bad site; ``running-var`` and ``metric-1e6`` depend on the set.
ATTACKS: dict[str, dict] = {
    "none": {}, "scaled": {"scale": 1000.0}, "sign-flip": {"scale": -1.0},
    "inflated-n": {"claim_examples": 10**15}, "nan-buffer": {"non_finite_buffer": True},
    "running-var": {}, "long-name": {"site_name": "h" * 300},  # longer than MLflow's 250
    "metric-1e6": {}, "steps-lie": {"claim_steps": 1}}
#: The attacks on normalisation statistics (rows only where the model has them).
STATISTICS_ATTACKS = ("nan-buffer", "running-var")
#: The local SGD learning rate of the FedNova rows (momentum: the run config's).
SGD_LR = 0.05


@dataclass(frozen=True)
class Row:
    """One row of the table: the attack, the product settings, what it is compared with."""

    attack: str
    defence: str = "default"
    aggregator: str = "default"
    baseline: str | None = None
    target: float | None = None


ROWS: dict[str, Row] = {
    "none/none": Row("none", defence="none"),
    "default/none": Row("none", baseline="none/none", target=0.99),
    **{f"default/{a}": Row(a, baseline="default/none", target=0.98)
       for a in ("scaled", "sign-flip", "inflated-n", "nan-buffer", "running-var",
                 "long-name", "metric-1e6")},
    "default+fednova/none": Row("none", aggregator="fednova", baseline="default/none"),
    "default+fednova/steps-lie": Row("steps-lie", aggregator="fednova",
                                     baseline="default+fednova/none", target=0.98),
    # only the quick test runs it (the undefended x1000: the defence must matter)
    "none/scaled": Row("scaled", defence="none", baseline="none/none"),
}


@dataclass(frozen=True)
class DataSet:
    """A shared real set dealt by ``clients.datagen shared`` (``--task``, ``--set``,
    ``--scheme``, ``--alpha``), its table metric (``val-<metric>``), its description, the
    task's run-config keys and whether its model has normalisation statistics."""

    task: str
    set_name: str
    scheme: str
    alpha: float
    metric: str
    description: str
    settings: dict = field(default_factory=dict)
    statistics: bool = True


DATA_SETS: dict[str, DataSet] = {
    "pneumoniamnist": DataSet(
        "cxr-cls", "pneumoniamnist", "dirichlet", 0.5, "auc",
        "PneumoniaMNIST (balanced npz) over Dirichlet(0.5) sites, the cxr-cls task "
        "(small DenseNet with BatchNorm, Adam)", {"image-size": 32, "batch-size": 16}),
    "pe": DataSet(
        "pe-seg", "msd-lung", "iid", 0.5, "dice",
        "PE stand-in: MSD Task06 lung-tumour CT patches (manual masks, 48 px, slab 1) over "
        "iid sites, the pe-seg task (2.5D U-Net with instance norm: no running statistics, "
        "so no nan-buffer / running-var rows; Adam)",
        {"image-size": 48, "slab-slices": 1, "batch-size": 16}, statistics=False),
}
SETS: dict[str, dict] = {
    f"{name}-{n}sites": {"data": name, "sites": n, "rounds": 4, "local_steps": 10,
                         "rows": [r for r in list(ROWS)[:-1] if data.statistics
                                  or ROWS[r].attack not in STATISTICS_ATTACKS]}
    for name, data in DATA_SETS.items() for n in (2, 3, 10)}
QUICK: dict[str, dict] = {
    "pneumoniamnist-quick": {"data": "pneumoniamnist", "sites": 3, "rounds": 1,
                             "local_steps": 2, "rows": ["none/none", "default/none",
                                                        "default/scaled", "none/scaled"]},
}
TABLE = {**SETS, **QUICK}


def honest_metric(final: Mapping[str, list], honest: Collection[str]) -> float | None:
    """Example-weighted metric over the ``honest`` sites' ``[value, examples]`` in ``final``
    (any other site, the attacker, left out; a site that sent no value, e.g. an AUC
    undefined on a one-class split, too); ``None`` if none has one or one is not finite."""
    pairs = [(value, n) for site, (value, n) in final.items()
             if site in honest and n and value is not None]
    if not pairs or any(not math.isfinite(v) for v, _ in pairs):
        return None
    return float(sum(v * n for v, n in pairs) / sum(n for _, n in pairs))


def _folders(name: str, root: Path, seed: int) -> tuple[list[Path], list[int], int]:
    """The set's site folders for ``seed``, their train counts and the attacker's index."""
    setup = TABLE[name]
    data = DATA_SETS[setup["data"]]
    folders = shared_sites(data.task, data.set_name, setup["sites"], seed, scheme=data.scheme,
                           alpha=data.alpha, root=root / f"sites-{setup['sites']}")
    counts = []
    for folder in folders:  # the train rows of its index (images.csv or manifest.csv)
        (index,) = [p for p in folder.glob("*.csv") if p.name in ("images.csv", "manifest.csv")]
        with index.open(newline="") as handle:
            counts.append(sum(row["split"] == "train" for row in csv.DictReader(handle)))
    return folders, counts, min(range(len(folders)), key=lambda i: counts[i])


def _sites(name: str, root: Path, arm: runner.Arm, seed: int) -> list:
    """The run's virtual sites: the smallest attacks with the arm's row's attack."""
    from app.engine import VirtualSite  # noqa: PLC0415 - the engine loads Flower
    from app.engine.attacks import SiteAttack, attacking_site  # noqa: PLC0415

    folders, counts, bad = _folders(name, root, seed)
    attack = ROWS[arm.name].attack
    keywords = dict(ATTACKS[attack])
    if attack == "running-var":
        keywords["poison_running_var"] = 2.0 * sum(counts) / max(counts[bad], 1)
    if attack == "metric-1e6":
        keywords["report_metrics"] = {f"val-{DATA_SETS[TABLE[name]['data']].metric}": 1e6}
    sites = [VirtualSite.folder(folder, site_name=hospital_name(i))
             for i, folder in enumerate(folders)]
    if keywords:
        sites[bad] = attacking_site(sites[bad], SiteAttack(**keywords))
    return sites


def _fields(name: str, root: Path, outcome, arm: runner.Arm, seed: int) -> dict:
    """A run's final and best honest metric and what the server dropped of the attacker."""
    folders, _, bad = _folders(name, root, seed)
    names = [hospital_name(i) for i in range(len(folders))]
    honest = [n for i, n in enumerate(names) if i != bad]
    key = f"val-{DATA_SETS[TABLE[name]['data']].metric}"
    reports = [outcome.reports[r] for r in sorted(outcome.reports)]

    def per_site(report) -> dict:
        return {site: [m.get(key), m.get("num-examples", 0.0)]
                for site, m in report.evaluate.items()}

    best = outcome.reports.get(outcome.best_round)
    dropped = [r.train_dropped for r in reports]
    evaluate_dropped = [r.evaluate_dropped for r in reports]
    return {"honest_metric": honest_metric(per_site(reports[-1]), honest),
            "final_site_metric": per_site(reports[-1]), "best_round": outcome.best_round,
            "best_metric": honest_metric(per_site(best), honest) if best else None,
            "metric_per_round": [r.evaluate_aggregate.get(key) for r in reports],
            "attacker": names[bad],
            "attacker_dropped_rounds": sum(any(s not in honest for s in d) for d in dropped),
            "attacker_evaluate_dropped_rounds": sum(any(s not in honest for s in d)
                                                    for d in evaluate_dropped),
            "drop_reasons": sorted({reason[:200] for d in dropped + evaluate_dropped
                                    for s, reason in d.items() if s not in honest}),
            "aggregation_failed_rounds": sum(bool(r.aggregation_failed) for r in reports)}


def federation(name: str, args: argparse.Namespace) -> runner.Federation:
    """The set's run config (the product's defaults, no roster), its rows, sites and fields."""
    setup = TABLE[name]
    data = DATA_SETS[setup["data"]]
    return runner.Federation(
        name, data.metric, (), {"task": data.task, **data.settings,
                                "num-server-rounds": setup["rounds"],
                                "local-steps": setup["local_steps"],
                                "min-nodes": setup["sites"], "node-wait-timeout": 10.0},
        arms=setup["rows"], sites=partial(_sites, name, args.data),
        fields=partial(_fields, name, args.data))


def arms(args: argparse.Namespace, index: int) -> list[runner.Arm]:
    """Every row: its defence (``default``: none named) and aggregator keys."""
    return [runner.Arm(name, {**({} if row.defence == "default"
                                 else {"strategy.defence": row.defence}),
                              **({"strategy.aggregator": "fednova", "optimizer": "sgd",
                                  "lr": SGD_LR} if row.aggregator == "fednova" else {})})
            for name, row in ROWS.items()]


def report_set(name: str, setup: dict, seeds: Collection[int], rows: list[dict]) -> dict:
    """The set's rows (mean over the seeds finished of the runner's ``rows``), its clean
    metric and its ``sets`` entry."""
    data = DATA_SETS[setup["data"]]
    found = {(r["row"], r["seed"]): r for r in rows if r["set"] == name}
    results = {row: {s: found[row, s] for s in seeds if (row, s) in found}
               for row in setup["rows"]}
    runs = []
    for row_name, per_seed in results.items():
        if not per_seed:
            continue
        row = ROWS[row_name]
        metrics = [r["honest_metric"] for r in per_seed.values()]
        base = results.get(row.baseline, {}) if row.baseline else per_seed  # itself: 1.0
        common = [s for s in per_seed if s in base]
        mine, theirs = (mean([runs_[s]["honest_metric"] for s in common])
                        for runs_ in (per_seed, base))
        best_mine, best_theirs = (mean([runs_[s]["best_metric"] for s in common])
                                  for runs_ in (per_seed, base))
        relative = mine / theirs if mine is not None and theirs else None
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
            "wall_s": mean([r["seconds"] for r in per_seed.values()]),
            **{k: [r[k] for r in per_seed.values()]
               for k in ("best_round", "attacker", "attacker_dropped_rounds",
                         "attacker_evaluate_dropped_rounds", "drop_reasons",
                         "aggregation_failed_rounds", "metric_per_round",
                         "final_site_metric")}})
    entry = {"description": f"{data.description}; {setup['sites']} sites by clients.datagen "
                            "shared; the attacker is the smallest site; no roster",
             "metric_name": f"val-{data.metric} of the final global model, example-weighted "
                            "over the honest sites' validation splits",
             "direction": "higher is better", "engine": "in-process",
             "setup": {**setup, "seeds": list(seeds), "task": data.task, **data.settings},
             "target": {"attack_relative_at_least": 0.98, "clean_relative_at_least": 0.99}}
    return {"clean": next((r["metric"] for r in runs if r["row"] == "default/none"), None),
            "runs": runs, "entry": entry}


def merged(previous: dict, report: dict) -> dict:
    """``report`` merged into the ``previous`` JSON, replacing only its own sets.

    The JSON is ``{"clean": {set: metric}, "runs": [...], "sets": {set: {...}},
    "seed_runs": [...], "engine": ..., "environment": ...}``; the sets in ``report``
    replace those of the same names, other sets stay. A run without ``sites`` (an older
    set's) gets its set's ``setup["sites"]``.
    """
    names = set(report["clean"])
    out = dict(previous)
    for key in ("clean", "sets"):
        out[key] = {**{k: v for k, v in previous.get(key, {}).items() if k not in names},
                    **report[key]}
    for key in ("runs", "seed_runs"):
        out[key] = [r for r in previous.get(key, []) if r["set"] not in names] + \
            report.get(key, [])
    for run in out["runs"]:
        sites = out["sets"].get(run["set"], {}).get("setup", {}).get("sites")
        if "sites" not in run and sites is not None:
            run["sites"] = sites
    out.update({k: v for k, v in report.items() if k not in ("clean", "runs", "sets",
                                                            "seed_runs")})
    return out


def summary(meta: dict, rows: list[dict], missing: list[str], args: argparse.Namespace) -> dict:
    """The sets of ``args`` that have runs, merged into ``--output``'s other sets."""
    report = {"clean": {}, "runs": [], "sets": {}, "seed_runs": [], "engine": "in-process",
              "environment": meta["versions"]}
    for name in args.sets:
        result = report_set(name, TABLE[name], args.seeds, rows)
        if result["runs"]:
            report["clean"][name] = result["clean"]
            report["runs"] += result["runs"]
            report["sets"][name] = result["entry"]
            report["seed_runs"] += [r for r in rows if r["set"] == name]
    previous = json.loads(args.output.read_text()) if args.output.is_file() else {}
    return json.loads(json.dumps(merged(previous, report), allow_nan=False))  # strict JSON


def table(payload: dict) -> str:
    """Per set of the attack table (its runs with a ``row``): metric, sd, / baseline..."""
    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    columns = [Column("row", "<26", lambda r: r["row"]),
               Column("metric", ">8", lambda r: cell(r["metric"])),
               Column("sd", ">7", lambda r: cell(r["sd"])),
               Column("/ baseline", ">10", lambda r: cell(r["relative_to_clean"])),
               Column("best /", ">7", lambda r: cell(r["best_relative_to_clean"])),
               Column("seeds", ">6", lambda r: len(r["seeds"])),
               Column("s/run", ">6", lambda r: f"{r['wall_s']:.0f}")]
    header = " ".join(c.head() for c in columns)
    lines = []
    for name in payload["sets"]:
        runs = [r for r in payload["runs"] if r["set"] == name]
        if all("row" in r for r in runs):
            lines += [f"{name} (clean, defaults: {cell(payload['clean'][name])})", header,
                      "-" * len(header)]
            lines += [" ".join(format(c.get(r), c.spec) for c in columns) for r in runs]
    return "\n".join(lines)


class _Quick(argparse.Action):
    """``--quick``: the one tiny set and seed 0 (the test)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        namespace.sets, namespace.seeds = list(QUICK), [0]


STUDY = runner.Study(
    name="robustness", doc=__doc__, output=BENCH / "results" / "robustness.json",
    sets=list(TABLE), federation=federation, arms=arms, schedule=lambda args, base: {},
    fields=lambda outcome, run, workdir: {}, summary=summary, table=table,
    rows_of=lambda payload: payload.get("seed_runs", []), arm_key="row",
    experiment="bench-robustness",
    options=(runner.Option("--quick", {"action": _Quick, "nargs": 0,
                                       "help": "one tiny set, seed 0 (the test)"}),
             runner.Option("--data", {"type": Path, "default": DATA,
                                      "help": "where the site folders go"})),
    defaults={"sets": list(SETS), "seeds": [0, 1, 2], "workdir": Path("/tmp/fedmed_robustness")})


if __name__ == "__main__":
    sys.exit(runner.main(STUDY))
