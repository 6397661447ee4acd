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
- **Label DP against the gradient attack** (issue #46): U-shaped split learning on the same
  set, every site's policy keeping its labels (``share-labels = false``) with
  ``vertical.label-dp-epsilon`` = 4, 2, 1, 0.5 (randomised response, Ghazi et al.,
  NeurIPS 2021: :mod:`clients.vertical.label_dp`) and, as ``none``, no label DP (the
  behaviour before issue #46; the product now runs it only where ``share-labels = true``,
  which this arm's policy says). The coordinator's attack is run on every ``split-head``
  reply (:class:`GradientAttack`): each example's dL/da2 by least squares on the head
  weights it last sent (``c = argmin ||W^T c - g||``; label 1 where c < 0); the row gives
  its accuracy against the site's true labels (all sites, rounds and batches) and the
  sites' mean test AUC, each over 3 seeds, 5 rounds (half the split rows' 10: 15
  federations fit in about 20 min on 2 busy cores).

Usage::

    python bench/vertical.py [--quick] [--seeds 5] [--only pvfed|split|label-dp]

It writes ``bench/results/vertical.json``: ``{"pvfed": [{"set", "department", "method",
"metric", "mean", "sd", "seeds"}], "split": [{"set", "method", "metric", "bytes",
"seconds", "sd", "seeds", "values"}], "label_dp": [{"set", "method", "epsilon",
"keep_probability", "attack_accuracy", "attack_sd", "attack_values", "metric", "sd",
"values", "seconds", "seeds"}], ...}`` (``metric`` names the measure, ``mean`` / ``sd``
over the seeds; a split or label-DP row's ``metric`` is its mean test AUC; a label-DP
row's ``epsilon`` is null for ``none``).
"""

from __future__ import annotations

from single_thread import BENCH  # noqa: I001 - first: one BLAS thread

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from engine_runs import DATA, SHARED, run_product, shared_sites  # noqa: E402
from report import Column, environment, print_table, write_report  # noqa: E402
from stats import mean_sd, pm  # noqa: E402

__all__ = ["GRID", "QUICK", "GradientAttack", "label_dp_rows", "main", "pvfed_rows",
           "split_rows"]

DEFAULT_OUTPUT = BENCH / "results" / "vertical.json"
GRID = {"seeds": 5, "pvfed_sets": ("heart-disease", "cohort"), "pvfed_rounds": 3,
        "aggregations": ("mean", "ae", "pca"), "split_rounds": 10, "split_steps": 20,
        "label_dp_seeds": 3, "label_dp_rounds": 5, "epsilons": ("none", 4.0, 2.0, 1.0, 0.5)}
QUICK = {"seeds": 1, "pvfed_sets": ("heart-disease",), "pvfed_rounds": 1,
         "aggregations": ("pca",), "split_rounds": 1, "split_steps": 2,
         "label_dp_seeds": 1, "label_dp_rounds": 1, "epsilons": ("none", 1.0)}
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


class GradientAttack:
    """A site's ClientApp, watched by the coordinator that attacks its labels (issue #46).

    The coordinator knows the head weights W it sent (``part/head.0.weight`` of a
    ``split-train`` that carries the site part: the start of every round's turn); from
    each ``split-head`` reply's dL/da2_j = W^T c_j, c_j = (sigmoid(z_j) - y_j) / (B L),
    it reads label 1 where the least-squares c_j < 0. The bench's truth (never the
    coordinator's) is the batch's training indices in the site's state file and the
    site's true labels (the task loaded from its folder by the product's task class).
    """

    def __init__(self) -> None:
        from app.engine.virtual_site import default_handler  # noqa: PLC0415 - loads torch

        self.handler = default_handler()
        self.weight: np.ndarray | None = None
        self.labels: np.ndarray | None = None
        self.right = self.total = 0

    def _true_labels(self, context) -> np.ndarray:
        from clients.registry import task_class  # noqa: PLC0415
        from clients.site.instruction import SiteRunSettings  # noqa: PLC0415

        if self.labels is None:
            run = SiteRunSettings.from_run_config(context.run_config)
            task = task_class(run.task)(Path(str(context.node_config["data-path"])), run.sizes)
            data = task.require_training()
            self.labels = np.stack([data[i][1].numpy() for i in range(len(data))])
        return self.labels

    def __call__(self, message, context):
        from clients.vertical.split_state import STATE_FILE  # noqa: PLC0415
        from safetensors.numpy import load_file  # noqa: PLC0415
        from strategies.wire import message_keys as keys  # noqa: PLC0415

        reply = self.handler(message, context)
        stage = str(message.content[keys.CONFIG].get(keys.VERTICAL_STAGE, ""))
        sent = message.content[keys.ARRAYS] if keys.ARRAYS in message.content else {}
        if stage == "split-train" and "part/head.0.weight" in sent:
            self.weight = sent["part/head.0.weight"].numpy()
        if stage != "split-head" or not reply.has_content() or self.weight is None:
            return reply
        state = next(Path(str(context.node_config["state-dir"])).rglob(STATE_FILE))
        pending = load_file(state)["pending-indices"]
        truth = self._true_labels(context)
        for j, indices in enumerate(pending):
            gradient = reply.content[keys.VERTICAL][f"gradient-{j}"].numpy()
            c = np.linalg.lstsq(self.weight.T, gradient.T, rcond=None)[0].T
            guessed = (c < 0).astype(np.float32)
            self.right += int(np.sum(guessed == truth[indices]))
            self.total += guessed.size
        return reply

    @property
    def accuracy(self) -> float:
        return self.right / self.total if self.total else math.nan


#: The label-DP arms' site policy: vertical federations allowed, the labels kept unless
#: ``share-labels`` (the ``none`` arm: no label DP, the pre-#46 behaviour), an evaluation per
#: round well inside ``max-evaluations``.
LABEL_DP_POLICY = ("[vertical]\nallowed = true\nshare-labels = {share}\n"
                   "label-dp-epsilon = {epsilon}\nmax-evaluations = 1000\n")


def _label_dp_run(epsilon: float | str, seed: int, grid: dict,
                  workdir: Path) -> tuple[float, float, float]:
    """One U-shaped federation whose sites keep their labels at ``epsilon`` (``"none"``: no
    label DP); the sites' mean test AUC, the attack's accuracy, seconds."""
    from app.engine import VirtualSite  # noqa: PLC0415

    folders = shared_sites("cxr-cls", "pneumoniamnist", 3, seed, root=DATA / "vertical-split")
    arm = f"label-dp-{epsilon}-{seed}"
    policy = workdir / "policies" / f"{arm}.toml"
    policy.parent.mkdir(parents=True, exist_ok=True)
    none = epsilon == "none"
    policy.write_text(LABEL_DP_POLICY.format(share="true" if none else "false",
                                             epsilon="inf" if none else repr(float(epsilon))))
    attacks = [GradientAttack() for _ in folders]
    sites = [VirtualSite.folder(folder, site_name=folder.name, policy_path=policy,
                                state_dir=workdir / "state" / arm / folder.name, handler=attack)
             for folder, attack in zip(folders, attacks)]
    overrides = {**SPLIT, "seed": seed, "num-server-rounds": grid["label_dp_rounds"],
                 "local-steps": grid["split_steps"], "federation.kind": "vertical",
                 "vertical.method": "splitnn-u", **SPLIT_CUT,
                 "vertical.batches-per-message": SPLIT_BATCHES["splitnn-u"]}
    outcome, wall = run_product(overrides, sites, workdir)
    aucs = [m["test-auc"] for m in outcome.result.site_metrics.values() if "test-auc" in m]
    right, total = sum(a.right for a in attacks), sum(a.total for a in attacks)
    return statistics.fmean(aucs), right / total, wall


def label_dp_rows(grid: dict, workdir: Path) -> list[dict]:
    """One row per epsilon (``none`` first): the attack's accuracy and the test AUC, mean and
    sd over the seeds, and RR's keep probability (the attack's expected accuracy)."""
    from clients.vertical.label_dp import label_keep_probability  # noqa: PLC0415

    rows = []
    for epsilon in grid["epsilons"]:
        runs = [_label_dp_run(epsilon, seed, grid, workdir)
                for seed in range(grid["label_dp_seeds"])]
        auc, auc_sd = mean_sd(r[0] for r in runs)
        attack, attack_sd = mean_sd(r[1] for r in runs)
        rows.append({"set": "pneumoniamnist", "method": "splitnn-u",
                     "epsilon": None if epsilon == "none" else float(epsilon),
                     "keep_probability": (1.0 if epsilon == "none"
                                          else label_keep_probability(float(epsilon), 1)),
                     "attack_accuracy": attack, "attack_sd": attack_sd,
                     "attack_values": [r[1] for r in runs], "metric": auc, "sd": auc_sd,
                     "values": [r[0] for r in runs],
                     "seconds": statistics.fmean(r[2] for r in runs), "seeds": len(runs),
                     "rounds": grid["label_dp_rounds"], "steps": grid["split_steps"]})
        print(rows[-1], flush=True)
    return rows


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
    parser.add_argument("--only", choices=("pvfed", "split", "label-dp"), default=None)
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
                           "split": {**SPLIT, **SPLIT_CUT},
                           "label_dp": {"policy": LABEL_DP_POLICY}},
              "pvfed": [], "split": [], "label_dp": []}
    earlier = json.loads(args.output.read_text()) if args.output.is_file() else {}
    if args.only is not None or args.sets:  # keep what this run does not redo
        report["split"] = earlier.get("split", [])
        report["label_dp"] = earlier.get("label_dp", [])
        report["pvfed"] = [row for row in earlier.get("pvfed", [])
                           if args.only in ("split", "label-dp")
                           or row["set"] not in grid["pvfed_sets"]]
        if args.only == "label-dp":  # its settings beside the earlier grid's
            report["grid"] = {**earlier.get("grid", {}), **{
                key: list(grid[key]) if key == "epsilons" else grid[key]
                for key in ("label_dp_seeds", "label_dp_rounds", "epsilons")}}
    if args.only in (None, "pvfed"):
        report["pvfed"] += pvfed_rows(grid, args.workdir, args.quick)
    if args.only in (None, "split"):
        report["split"] = split_rows(grid, args.workdir)
    if args.only in (None, "label-dp"):
        report["label_dp"] = label_dp_rows(grid, args.workdir)
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
    print_table("Label DP against the gradient attack (U-shaped, share-labels = false)", [
        Column("epsilon", "<8", lambda r: "none" if r["epsilon"] is None else f"{r['epsilon']:g}"),
        Column("RR keep", ">8", lambda r: f"{r['keep_probability']:.3f}"),
        Column("attack accuracy", ">17", lambda r: pm(r["attack_accuracy"], r["attack_sd"],
                                                      ".3f")),
        Column("test AUC", ">15", lambda r: pm(r["metric"], r["sd"], ".4f")),
        Column("seconds", ">8", lambda r: f"{r['seconds']:.1f}")], report["label_dp"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
