"""Attack benchmark: one bad site against each defence, through the product (issues #12, #27).

A benchmark run is a configuration: PneumoniaMNIST site folders written by the
product's converter (``python -m clients.datagen shared --task cxr-cls --set
pneumoniamnist --scheme dirichlet --alpha 0.5``), the run config of the product
(task ``cxr-cls``, ``strategy.defence`` / ``strategy.aggregator`` per row) and the
in-process engine (:func:`app.engine.run_federation`: the real ServerApp against
the real ClientApp at every site). The smallest site attacks from round 1 on, as
a site of the engine (:mod:`app.engine.attacks`, :class:`app.engine.SiteFaults`):

* ``inflated-n``: its train replies claim 1e15 examples (honest update);
* ``scaled``: its update x1000; ``sign-flip``: its update x-1;
* ``nan``: NaN / inf values in its update's payload;
* ``noise``: a standard-normal vector instead of its update;
* ``always-fails``: its ClientApp raises on every instruction;
* ``label-flip``: it trains on a copy of its folder with the training labels flipped;
* ``none``: the clean run of each defence.

Everything a deployed federation does applies: the reply intake (a NaN payload is
refused there), the first-declaration cap on ``num-examples``, the size caps, the
site policy, tracking. Metric: the product's validation AUC of the final global
model (the last round's per-site ``val-auc``, example-weighted over the honest
sites' held-out validation splits: the attacker's own split is left out, so a
site that fails and one whose update is refused score alike; higher is better);
``relative_to_clean`` = metric / clean FedAvg's. The #12 target: every attack at
least 0.98 of clean under the defence, the defence's clean run at least 0.99. A run
whose final model has no finite AUC has ``metric`` null.

Every finished run is kept in ``--checkpoint`` at once (a rerun resumes); the
report merges its sets into ``--output``, replacing only those sets.

    .venv/bin/python bench/robustness.py                   # -> bench/results/robustness.json
    .venv/bin/python bench/robustness.py --sets pneumoniamnist-dirichlet-2sites
    .venv/bin/python bench/robustness.py --quick --output /tmp/r.json   # the test
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import BENCH  # noqa: I001

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

from engine_runs import DATA, run_product, shared_sites  # noqa: E402
from report import Column, environment, print_table, write_report  # noqa: E402
from site_labels import train_labels  # noqa: E402

__all__ = ["ATTACKS", "DEFENCES_RUN", "QUICK", "SETS", "main", "merge_report"]

DEFAULT_OUTPUT = BENCH / "results" / "robustness.json"
DEFAULT_CHECKPOINT = Path("/tmp/fedmed_robustness_checkpoint.json")
TARGET_RELATIVE, TARGET_CLEAN_COST = 0.02, 0.01


@dataclass(frozen=True)
class Attack:
    """One row's bad site: a reply attack (``app.engine.attacks.SiteAttack`` keywords),
    a fault from round 1, or a label-flipped copy of its folder."""

    reply: tuple[tuple[str, object], ...] = ()
    fails: bool = False
    flip_labels: bool = False


ATTACKS: dict[str, Attack] = {
    "none": Attack(),
    "inflated-n": Attack(reply=(("claim_examples", 10**15),)),
    "scaled": Attack(reply=(("scale", 1000.0),)),
    "sign-flip": Attack(reply=(("scale", -1.0),)),
    "nan": Attack(reply=(("non_finite", True),)),
    "noise": Attack(reply=(("noise_std", 1.0),)),
    "always-fails": Attack(fails=True),
    "label-flip": Attack(flip_labels=True),
}
#: Name in the table -> (strategy.defence, strategy.aggregator). FedNova is not run: the
#: product's tasks train with Adam and the run config refuses FedNova with Adam.
DEFENCES_RUN: dict[str, tuple[str, str]] = {
    "fedavg": ("none", "fedavg"),
    "norm-bound": ("norm-bound", "fedavg"),
    "multi-krum": ("multi-krum", "fedavg"),
    "trimmed-mean": ("none", "trimmed-mean"),
    "median": ("none", "median"),
}
_BASE = {"sites": 3, "alpha": 0.5, "seed": 0, "rounds": 4, "local_steps": 10, "batch_size": 16,
         "image_size": 32, "defences": list(DEFENCES_RUN),
         "attacks": list(ATTACKS)}
SETS: dict[str, dict] = {
    "pneumoniamnist-dirichlet-3sites": _BASE,
    "pneumoniamnist-dirichlet-2sites": {**_BASE, "sites": 2,
                                        "defences": ["fedavg", "norm-bound"]},
}
QUICK: dict[str, dict] = {
    "pneumoniamnist-quick": {**_BASE, "rounds": 1, "local_steps": 2,
                             "defences": ["fedavg", "norm-bound"],
                             "attacks": ["none", "scaled"]},
}
METRIC = ("val-auc of the final global model, example-weighted over the honest sites' "
          "validation splits")


def federation_sites(setup: dict, attack: Attack, root: Path) -> tuple[list, str]:
    """The set's virtual sites with ``attack`` at the smallest one; the attacker's name."""
    from app.engine import SiteFaults, VirtualSite
    from app.engine.attacks import SiteAttack, attacking_site, label_flipped_copy

    folders = shared_sites("cxr-cls", "pneumoniamnist", setup["sites"], setup["seed"],
                           scheme="dirichlet", alpha=setup["alpha"],
                           root=root / f"sites-{setup['sites']}")  # a folder per site count
    bad = min(range(len(folders)), key=lambda i: train_labels(folders[i]).size)
    sites = []
    for i, folder in enumerate(folders):
        if i == bad and attack.flip_labels:
            flipped = folder.parent / f"{folder.name}-label-flipped"
            folder = flipped if flipped.is_dir() else label_flipped_copy(folder, flipped)
        fails = SiteFaults(fail_from_round=1) if i == bad and attack.fails else None
        site = VirtualSite.folder(folder, site_name=f"hospital-{i:02d}", faults=fails)
        if i == bad and attack.reply:
            site = attacking_site(site, SiteAttack(**dict(attack.reply)))
        sites.append(site)
    return sites, f"hospital-{bad:02d}"


def honest_auc(final: dict[str, list], attacker: str) -> float | None:
    """Example-weighted val-auc of the final model over the honest sites (the attacker's
    own validation split left out, whether it evaluates or fails); ``None`` if not finite."""
    pairs = [(auc, n) for site, (auc, n) in final.items() if site != attacker and n]
    if not pairs or any(auc is None or not math.isfinite(auc) for auc, _ in pairs):
        return None
    return float(sum(auc * n for auc, n in pairs) / sum(n for _, n in pairs))


def run_one(setup: dict, defence: str, attack: str, workdir: Path, root: Path) -> dict:
    """One federation of the product; its final metric, curve and what the server dropped."""
    sites, attacker = federation_sites(setup, ATTACKS[attack], root)
    defence_name, aggregator = DEFENCES_RUN[defence]
    outcome, wall = run_product({
        "task": "cxr-cls", "image-size": setup["image_size"], "batch-size": setup["batch_size"],
        "num-server-rounds": setup["rounds"], "local-steps": setup["local_steps"],
        "min-nodes": setup["sites"], "seed": setup["seed"], "node-wait-timeout": 10.0,
        "strategy.defence": defence_name, "strategy.aggregator": aggregator,
        "experiment": "bench-robustness"}, sites, workdir)
    reports = [outcome.reports[r] for r in sorted(outcome.reports)]
    final = {site: [m.get("val-auc"), m.get("num-examples", 0.0)]
             for site, m in reports[-1].evaluate.items()}
    return {"metric": honest_auc(final, attacker), "final_site_val_auc": final,
            "val_auc_per_round": [r.evaluate_aggregate.get("val-auc") for r in reports],
            "attacker": attacker, "wall_s": wall,
            "attacker_dropped_rounds": sum(attacker in r.train_dropped for r in reports),
            "aggregation_failed_rounds": sum(bool(r.aggregation_failed) for r in reports),
            "mlflow_run_id": outcome.mlflow_run_id}


def run_set(name: str, setup: dict, checkpoint: Path, workdir: Path, root: Path) -> dict:
    """Run every (defence, attack) of the set not in ``checkpoint`` yet; the checkpoint."""
    done = json.loads(checkpoint.read_text()) if checkpoint.is_file() else {}
    for defence in setup["defences"]:
        for attack in setup["attacks"]:
            key = f"{name}|{defence}|{attack}"
            if key not in done:
                done[key] = run_one(setup, defence, attack, workdir, root)
                print(f"{key}: {done[key]['metric']} ({done[key]['wall_s']:.0f} s)", flush=True)
                checkpoint.write_text(json.dumps(done, indent=1))
    return done


def report_set(name: str, setup: dict, done: dict) -> dict:
    """The set's clean value, its runs and its ``sets`` entry."""
    results = {(d, a): done[f"{name}|{d}|{a}"] for d in setup["defences"]
               for a in setup["attacks"]}
    clean = results[("fedavg", "none")]["metric"]
    runs = []
    for (defence, attack), result in results.items():
        metric = result["metric"]
        relative = None if metric is None or not clean else metric / clean
        bound = 1.0 - (TARGET_CLEAN_COST if attack == "none" else TARGET_RELATIVE)
        runs.append({"set": name, "attack": attack, "defence": defence, "metric": metric,
                     "relative_to_clean": relative, "seeds": [setup["seed"]],
                     "within_target": relative is not None and relative >= bound,
                     **{k: result[k] for k in ("val_auc_per_round", "final_site_val_auc",
                                               "attacker", "attacker_dropped_rounds",
                                               "aggregation_failed_rounds", "wall_s")}})
    entry = {"description": f"PneumoniaMNIST (balanced npz) over {setup['sites']} "
                            f"Dirichlet({setup['alpha']}) sites by clients.datagen shared, "
                            "the product's cxr-cls task; the attacker is the smallest site",
             "metric_name": METRIC, "direction": "higher is better", "engine": "in-process",
             "setup": setup, "target": {"attack_relative_at_least": 1 - TARGET_RELATIVE,
                                        "clean_relative_at_least": 1 - TARGET_CLEAN_COST}}
    return {"clean": clean, "runs": runs, "entry": entry}


def merge_report(path: Path, report: dict) -> dict:
    """Write ``report`` into the JSON at ``path``, replacing only its own sets.

    The file keeps ``{"clean": {set: metric}, "runs": [...], "sets": {set: {...}},
    "engine": ..., "environment": ...}``; the sets in ``report`` replace those of
    the same names, other sets stay. Returns what was written (strict JSON: no NaN).
    """
    path = Path(path)
    merged = json.loads(path.read_text()) if path.is_file() else {}
    names = set(report["clean"])
    merged["clean"] = {**{k: v for k, v in merged.get("clean", {}).items() if k not in names},
                       **report["clean"]}
    merged["runs"] = [r for r in merged.get("runs", []) if r["set"] not in names] + report["runs"]
    merged["sets"] = {**{k: v for k, v in merged.get("sets", {}).items() if k not in names},
                      **report["sets"]}
    merged.update({k: v for k, v in report.items() if k not in ("clean", "runs", "sets")})
    write_report(path, merged, allow_nan=False)
    return merged


def _table(name: str, result: dict, setup: dict) -> None:
    rows = {(r["defence"], r["attack"]): r["relative_to_clean"] for r in result["runs"]}

    def cell(d: str, a: str) -> str:
        v = rows[(d, a)]
        return "no AUC" if v is None else f"{v:.3f}"

    columns = [Column("defence", "<13", lambda d: d)] + [
        Column(a, ">12", lambda d, a=a: cell(d, a)) for a in setup["attacks"]]
    print_table(f"val-auc / clean ({name}; clean FedAvg {result['clean']})", columns,
                setup["defences"])


def main(argv: list[str] | None = None) -> int:
    table = SETS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=None, help=f"default: {sorted(table)}")
    parser.add_argument("--quick", action="store_true", help="one tiny set (the test)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON to merge into")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help=f"finished runs (default {DEFAULT_CHECKPOINT}; --quick: fresh)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fedmed_robustness"),
                        help="MLflow store of the runs")
    parser.add_argument("--data", type=Path, default=DATA, help="where the site folders go")
    args = parser.parse_args(argv)
    table = QUICK if args.quick else SETS
    checkpoint = args.checkpoint or (args.workdir / "quick-checkpoint.json" if args.quick
                                     else DEFAULT_CHECKPOINT)
    if args.quick:
        checkpoint.unlink(missing_ok=True)
    report = {"clean": {}, "runs": [], "sets": {}, "engine": "in-process",
              "environment": environment()}
    for name in args.sets or sorted(table):
        done = run_set(name, table[name], checkpoint, args.workdir, args.data)
        result = report_set(name, table[name], done)
        report["clean"][name] = result["clean"]
        report["runs"] += result["runs"]
        report["sets"][name] = result["entry"]
        _table(name, result, table[name])
    merge_report(args.output, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
