"""Vertical federations through the product: pvFed against local-best, split learning against FedAvg.

Every figure is a federation of the real ServerApp and ClientApp on the in-process engine
(:func:`engine_runs.run_product`, ``federation.kind = "vertical"``); nothing here trains a
model of its own.

- **pvFed** (Nishikawa et al., IEEJ Trans. 2024) on two vertical sets written by the
  product (``python -m clients.datagen vertical``): ``heart-disease`` (Cleveland's 303
  patients split over a clinic, a stress-test lab and a catheter lab, each with its own
  task) and ``cohort`` (the synthetic multimodal cohort: CT, radiograph, labs). Per seed,
  one federation per aggregation (mean, ae, pca); each department reports the test AUC of
  its local model alone (``local-best``: a federation's sites draw their seeds from its
  id, so a seed's value is the mean over its federations) and of its redefined output
  layer on [global vector, own features] (``pvfed-<aggregation>``).
- **Split learning** (Vepakomma et al. 2018) on PneumoniaMNIST over 3 sites (iid), the
  same small DenseNet as FedAvg's: FedAvg (horizontal), vanilla SplitNN and U-shaped
  SplitNN, with the sites' mean test AUC, the bytes of training on the wire (FedAvg: its
  train messages serialised; split learning: the arrays of its training stages; split
  learning's evaluation bytes apart, in ``bytes_with_evaluation``) and the wall time.

Usage::

    python bench/vertical.py [--quick] [--seeds 5] [--only pvfed|split]

It writes ``bench/results/vertical.json``: ``{"pvfed": [{"set", "department", "method",
"metric", "mean", "sd", "seeds"}], "split": [{"set", "method", "metric", "bytes",
"seconds", "sd", "seeds", "values"}], ...}`` (``metric`` names the measure, ``mean`` /
``sd`` over the seeds; a split row's ``metric`` is its mean test AUC).
"""

from __future__ import annotations

from single_thread import BENCH  # noqa: I001 - first: one BLAS thread

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

from engine_runs import DATA, SHARED, run_product, shared_sites  # noqa: E402
from report import Column, environment, print_table, write_report  # noqa: E402
from stats import mean_sd, pm  # noqa: E402

__all__ = ["GRID", "QUICK", "main", "pvfed_rows", "split_rows"]

DEFAULT_OUTPUT = BENCH / "results" / "vertical.json"
GRID = {"seeds": 5, "pvfed_sets": ("heart-disease", "cohort"), "pvfed_rounds": 3,
        "aggregations": ("mean", "ae", "pca"), "split_rounds": 10, "split_steps": 20}
QUICK = {"seeds": 1, "pvfed_sets": ("heart-disease",), "pvfed_rounds": 1,
         "aggregations": ("pca",), "split_rounds": 1, "split_steps": 2}
#: pvFed's run config (the vertical.* epochs are pyproject.toml's unless --quick).
PVFED = {"federation.kind": "vertical", "vertical.method": "pvfed", "min-nodes": 3,
         "batch-size": 32, "image-size": 32, "volume-depth": 16, "model-size": "small",
         "node-wait-timeout": 30.0, "experiment": "bench-vertical-pvfed"}
QUICK_EPOCHS = {"vertical.local-epochs": 3, "vertical.encoder-epochs": 5,
                "vertical.global-epochs": 5, "vertical.head-epochs": 3}
#: Per set, the run config beyond PVFED: the cohort's image networks train fewer epochs
#: (a CT volume network at 100 epochs takes about 15 min a run on 2 CPU cores).
SET_SETTINGS = {"heart-disease": {"task": "tabular-cls"},
                "cohort": {"vertical.local-epochs": 15, "vertical.head-epochs": 30}}
#: Aggregations that do not apply to a set, and why (a row says so instead of a figure).
NOT_APPLICABLE = {("cohort", "mean"): "the sites' feature widths differ (16, 108, 32): "
                                      "mean aggregation needs one width"}
#: PneumoniaMNIST, the same network and batches for FedAvg and split learning.
SPLIT = {"task": "cxr-cls", "image-size": 32, "batch-size": 16, "model-size": "small",
         "min-nodes": 3, "node-wait-timeout": 30.0, "experiment": "bench-vertical-split"}
#: Split learning's cut: after the DenseNet's first pooling (1,024 floats per image, not 4,096).
SPLIT_CUT = {"vertical.cut": 4}
#: Batches per message: 1, exactly SplitNN. At 8 (a gradient up to 7 steps stale, 8x fewer
#: messages) vanilla lost 1.6 points of AUC on this set, 5 seeds (docs/BENCHMARKS.md).
SPLIT_BATCHES = {"splitnn": 1, "splitnn-u": 1}


def _vertical_folders(set_name: str, seed: int, root: Path) -> list[Path]:
    """The vertical set's site folders for ``seed`` (written once by the product's writer)."""
    from clients.datagen.vertical_sets import VERTICAL_SETS  # noqa: PLC0415
    from strategies.wire.registry import import_path  # noqa: PLC0415

    out = (root / f"vertical-{set_name}-seed{seed}").resolve()
    stamp = out / ".written"
    if not stamp.is_file():
        import_path(VERTICAL_SETS[set_name])(shared=SHARED, out=out, seed=seed)
        stamp.touch()
    return sorted(p for p in out.iterdir() if (p / "vertical-site.toml").is_file())


def _sites(folders: Sequence[Path], state: Path) -> list:
    from app.engine import VirtualSite  # noqa: PLC0415 - the engine loads Flower

    return [VirtualSite.folder(folder, site_name=folder.name, state_dir=state / folder.name)
            for folder in folders]


def pvfed_rows(grid: dict, workdir: Path, quick: bool) -> list[dict]:
    """One row per (set, department, method): the test AUC's mean and sd over the seeds."""
    rows = []
    for set_name in grid["pvfed_sets"]:
        values: dict[tuple[str, str], list[float]] = {}
        for seed in range(grid["seeds"]):
            folders = _vertical_folders(set_name, seed, DATA)
            local: dict[str, list[float]] = {}
            for aggregation in grid["aggregations"]:
                if (set_name, aggregation) in NOT_APPLICABLE:
                    continue
                overrides = {**PVFED, **SET_SETTINGS.get(set_name, {}),
                             **(QUICK_EPOCHS if quick else {}), "seed": seed,
                             "num-server-rounds": grid["pvfed_rounds"],
                             "vertical.aggregation": aggregation}
                state = workdir / "state" / f"{set_name}-{seed}-{aggregation}"
                outcome, _ = run_product(overrides, _sites(folders, state), workdir)
                for department, metrics in outcome.result.site_metrics.items():
                    values.setdefault((department, f"pvfed-{aggregation}"), []).append(
                        metrics["pvfed-test-auc"])
                    local.setdefault(department, []).append(metrics["local-test-auc"])
                print(set_name, seed, aggregation, outcome.result.site_metrics, flush=True)
            for department, aucs in local.items():  # each federation draws its own seeds
                values.setdefault((department, "local-best"), []).append(statistics.fmean(aucs))
        departments = sorted({department for department, _ in values})
        for aggregation in grid["aggregations"]:
            note = NOT_APPLICABLE.get((set_name, aggregation))
            rows.extend({"set": set_name, "department": department, "method": f"pvfed-{aggregation}",
                         "metric": "test-auc", "mean": None, "sd": None, "seeds": 0,
                         "values": [], "note": note} for department in departments if note)
        for (department, method), seeds in sorted(values.items()):
            mean, sd = mean_sd(seeds)
            rows.append({"set": set_name, "department": department, "method": method,
                         "metric": "test-auc", "mean": mean, "sd": sd, "seeds": len(seeds),
                         "values": seeds})
    return rows


def _fedavg(seed: int, grid: dict, workdir: Path) -> tuple[float, int, float, int]:
    """FedAvg's mean test AUC over the sites (the selected round), the train exchanges'
    serialised bytes (twice: its evaluate messages are not counted), seconds."""
    folders = shared_sites("cxr-cls", "pneumoniamnist", 3, seed, root=DATA / "vertical-split")
    overrides = {**SPLIT, "seed": seed, "num-server-rounds": grid["split_rounds"],
                 "local-steps": grid["split_steps"], "final-evaluation": True,
                 "strategy.defence": "none"}
    outcome, wall = run_product(overrides, _sites(folders, workdir / "state" / f"fedavg-{seed}"),
                                workdir)
    aucs = [m["test-auc"] for m in outcome.cross_site.sites.values() if "test-auc" in m]
    train = sum(t.get("bytes-up", 0.0) + t.get("bytes-down", 0.0)  # the train exchanges
                for report in outcome.reports.values() for t in report.traffic.values())
    return statistics.fmean(aucs), int(train), wall, int(train)


def _split(method: str, seed: int, grid: dict, workdir: Path) -> tuple[float, int, float, int]:
    """Split learning's mean test AUC over the sites (last round), the training stages' array
    bytes, seconds, and the bytes with the evaluation stages."""
    folders = shared_sites("cxr-cls", "pneumoniamnist", 3, seed, root=DATA / "vertical-split")
    overrides = {**SPLIT, "seed": seed, "num-server-rounds": grid["split_rounds"],
                 "local-steps": grid["split_steps"], "federation.kind": "vertical",
                 "vertical.method": method, **SPLIT_CUT,
                 "vertical.batches-per-message": SPLIT_BATCHES[method]}
    state = workdir / "state" / f"{method}-{seed}"
    outcome, wall = run_product(overrides, _sites(folders, state), workdir)
    aucs = [m["test-auc"] for m in outcome.result.site_metrics.values() if "test-auc" in m]
    traffic = outcome.traffic.uplink_bytes + outcome.traffic.downlink_bytes
    train = sum(row["uplink-bytes"] + row["downlink-bytes"]
                for stage, row in outcome.traffic.by_stage.items()
                if stage in ("split-train", "split-head"))
    return statistics.fmean(aucs), int(train), wall, int(traffic)


def split_rows(grid: dict, workdir: Path) -> list[dict]:
    """One row per method: mean test AUC, bytes and seconds over the seeds."""
    rows = []
    for method in ("fedavg", "splitnn", "splitnn-u"):
        runs = [(_fedavg(seed, grid, workdir) if method == "fedavg"
                 else _split(method, seed, grid, workdir)) for seed in range(grid["seeds"])]
        aucs = [r[0] for r in runs]
        mean, sd = mean_sd(aucs)
        rows.append({"set": "pneumoniamnist", "method": method, "metric": mean, "sd": sd,
                     "bytes": int(statistics.fmean(r[1] for r in runs)),
                     "bytes_with_evaluation": int(statistics.fmean(r[3] for r in runs)),
                     "seconds": statistics.fmean(r[2] for r in runs), "seeds": len(runs),
                     "values": aucs})
        print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fedmed_bench_vertical"))
    parser.add_argument("--quick", action="store_true", help="the test's tiny grid")
    parser.add_argument("--seeds", type=int, default=None, help="seeds (default 5)")
    parser.add_argument("--only", choices=("pvfed", "split"), default=None)
    parser.add_argument("--sets", default=None,
                        help="pvFed's sets, comma-separated (default heart-disease,cohort)")
    args = parser.parse_args(argv)
    grid = dict(QUICK if args.quick else GRID)
    if args.seeds:
        grid["seeds"] = args.seeds
    if args.sets:
        grid["pvfed_sets"] = tuple(args.sets.split(","))
    report = {"environment": environment(), "grid": {k: list(v) if isinstance(v, tuple) else v
                                                     for k, v in grid.items()},
              "settings": {"pvfed": PVFED, "pvfed_sets": SET_SETTINGS,
                           "split": {**SPLIT, **SPLIT_CUT}}, "pvfed": [], "split": []}
    earlier = json.loads(args.output.read_text()) if args.output.is_file() else {}
    if args.only is not None or args.sets:  # keep what this run does not redo
        report["split"] = earlier.get("split", [])
        report["pvfed"] = [row for row in earlier.get("pvfed", [])
                           if args.only == "split" or row["set"] not in grid["pvfed_sets"]]
    if args.only in (None, "pvfed"):
        report["pvfed"] += pvfed_rows(grid, args.workdir, args.quick)
    if args.only in (None, "split"):
        report["split"] = split_rows(grid, args.workdir)
    write_report(args.output, report)
    print_table("pvFed vs local-best (test AUC, mean ± sd over seeds)", [
        Column("set", "<14", lambda r: r["set"]),
        Column("department", "<12", lambda r: r["department"]),
        Column("method", "<11", lambda r: r["method"]),
        Column("test AUC", ">15", lambda r: pm(r["mean"], r["sd"], ".4f"))], report["pvfed"])
    print_table("Split learning vs FedAvg (PneumoniaMNIST, 3 sites)", [
        Column("method", "<10", lambda r: r["method"]),
        Column("test AUC", ">15", lambda r: pm(r["metric"], r["sd"], ".4f")),
        Column("MB", ">8", lambda r: f"{r['bytes'] / 1e6:.2f}"),
        Column("seconds", ">8", lambda r: f"{r['seconds']:.1f}")], report["split"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
