"""Power-of-Choice client selection vs uniform sampling on PneumoniaMNIST, through the product.

Cho, Wang, Joshi, "Towards Understanding Biased Client Selection in Federated
Learning", AISTATS 2022 (Alg. 1 and Sec. 5). A benchmark run is a configuration
of the product, run by the in-process engine (:func:`app.engine.run_federation`:
the real ServerApp against the real ClientApp at every site):

* sites: PneumoniaMNIST (28x28 chest X-rays, label **pneumonia** vs normal) dealt to
  ``num_sites`` folders by the product's converter with a Dirichlet(``alpha``)
  label split (``python -m clients.datagen shared --task cxr-cls --set
  pneumoniamnist --scheme dirichlet``), each with its own validation split;
* run config: task ``cxr-cls`` (its small CNN, Adam at the sites, 32 px), ``tau``
  local steps, the method's ``strategy.selector`` with ``selection.m`` sites per
  round, candidate set ``selection.d`` (``adaptive-d``: ``pow-d`` with ``d = 0``,
  all sites down to ``m``) and ``selection.subset`` (``cpow-d``); every site
  evaluates the new global model each round (``fraction-evaluate = 1``);
* ``pow-d`` / ``cpow-d`` ask the candidates for the global model's training loss
  with Flower ``query`` messages (the site's whole training split / ``subset``
  examples); ``rpow-d`` uses the last train loss each site reported.

Seed index ``s`` fixes the split (the converter's ``--seed``) and the run's
``seed`` (model initialisation, selector, each site's batches per round through
:func:`strategies.wire.seeds.site_seed`), shared by every method.

Metrics per method (mean over seeds), from the federation's round reports: rounds
to the target validation accuracy (first round whose trailing mean over ``smooth``
rounds reaches it; not reached counts as ``rounds``, a lower bound), final
accuracy (mean of the last ``final_window`` rounds' ``val-accuracy``), the examples
forwarded by the queries (each candidate's training split, or ``subset`` of it),
speedup = uniform's rounds / the method's, and the label mix of the selected
sites. Issue target: ``pow-d`` reaches the target in >= 1.5x fewer rounds than
uniform with a final accuracy no worse.

    .venv/bin/python bench/selection_powd.py [--rounds 20] [--seeds 2] [--output ...]
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import BENCH  # noqa: I001

import argparse  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from curves import rounds_to_target  # noqa: E402
from engine_runs import DATA, run_product, shared_sites  # noqa: E402
from report import environment, write_report  # noqa: E402
from site_labels import train_labels  # noqa: E402
from stats import pm, sd  # noqa: E402
from clients.datagen.federation import hospital_name  # noqa: E402

__all__ = ["CONFIG", "METHODS", "main", "run_method", "summarise"]

DEFAULT_OUTPUT = BENCH / "results" / "selection_powd.json"

CONFIG = {
    "num_sites": 10,
    "alpha": 0.3,
    "m": 2,
    "d": 4,  # 2m
    "cpow_subset": 32,  # one mini-batch per candidate (paper: cpow-d estimates on b samples)
    "rounds": 20,
    "tau": 5,
    "batch_size": 32,
    "image_size": 32,
    "seeds": 2,
    "target_accuracy": 0.80,
    "smooth": 3,
    "final_window": 3,
    "speedup_target": 1.5,
}

#: Method -> its run-config keys (``{m}``, ``{d}``, ``{subset}`` from the config).
METHODS: dict[str, dict] = {
    "uniform": {"strategy.selector": "uniform"},
    "pow-d": {"strategy.selector": "pow-d"},
    "cpow-d": {"strategy.selector": "cpow-d"},
    "rpow-d": {"strategy.selector": "rpow-d"},
    "adaptive-d": {"strategy.selector": "pow-d", "selection.d": 0},
}


def site_folders(cfg: dict, seed: int, root: Path = DATA) -> list[Path]:
    """The seed's label-skewed site folders (the product's converter, written once)."""
    return shared_sites("cxr-cls", "pneumoniamnist", cfg["num_sites"], seed,
                        scheme="dirichlet", alpha=cfg["alpha"],
                        root=root / f"sites-{cfg['num_sites']}")  # a folder per site count


def run_method(method: str, folders: list[Path], cfg: dict, seed: int, workdir: Path) -> dict:
    """One federation of the product with the method's selector; its curve and selections."""
    from app.engine import VirtualSite

    names = [hospital_name(i) for i in range(len(folders))]
    sites = [VirtualSite.folder(f, site_name=n) for f, n in zip(folders, names)]
    overrides = {"task": "cxr-cls", "image-size": cfg["image_size"],
                 "batch-size": cfg["batch_size"], "local-steps": cfg["tau"],
                 "num-server-rounds": cfg["rounds"], "min-nodes": len(sites), "seed": seed,
                 "node-wait-timeout": 10.0, "fraction-evaluate": 1.0,
                 "selection.m": cfg["m"], "selection.d": cfg["d"],
                 "selection.subset": cfg["cpow_subset"], "experiment": "bench-selection",
                 **METHODS[method]}
    started = time.perf_counter()
    outcome, _ = run_product(overrides, sites, workdir)
    reports = [outcome.reports[r] for r in sorted(outcome.reports)]
    # a site is named in the reports by its name once it replied, by its node id before
    index = {**{n: i for i, n in enumerate(names)},
             **{f"node-{s.node_id}": i for i, s in enumerate(sites)}}
    sizes = [int(train_labels(f).size) for f in folders]
    subset = cfg["cpow_subset"] if overrides["strategy.selector"] == "cpow-d" else 0
    queried = [[index[c] for c in r.selection.get("losses", {})]  # rpow-d: no query sent
               if r.strategy.get("query-bytes-down") else [] for r in reports]
    passes = [sum(min(sizes[c], subset) if subset else sizes[c] for c in q) for q in queried]
    last = reports[-1].times_selected
    return {
        "seed": seed,
        "val_accuracy": [float(r.evaluate_aggregate.get("val-accuracy", float("nan")))
                         for r in reports],
        "val_auc": [float(r.evaluate_aggregate.get("val-auc", float("nan"))) for r in reports],
        "candidate_losses_per_round": [{str(index[c]): v for c, v in
                                    r.selection.get("losses", {}).items()} for r in reports],
        "query_forward_passes": int(sum(passes)),
        "query_forward_passes_per_round": passes,
        "query_bytes_down": float(sum(r.strategy.get("query-bytes-down", 0.0) for r in reports)),
        "d_per_round": [r.strategy.get("selection-d") for r in reports],
        "times_selected": [int(sum(v for k, v in last.items() if index[k] == i))
                           for i in range(len(names))],
        "selected_per_round": [[index[s] for s in r.selection.get("selected", [])]
                               for r in reports],
        "mlflow_run_id": outcome.mlflow_run_id,
        "wall_s": time.perf_counter() - started,
    }


def selection_balance(run: dict, split_info: dict) -> dict:
    """Label mix of the selected sites per round: the pneumonia fraction of their
    pooled training data, its mean distance from 0.5, and its lag-1 autocorrelation
    over rounds (negative = the selected class mix alternates round to round)."""
    sizes = np.asarray(split_info["sizes"], dtype=float)
    frac = np.asarray(split_info["pneumonia_fraction"])
    mix = np.array([float((sizes[s] * frac[s]).sum() / sizes[s].sum())
                    for s in run["selected_per_round"] if s])
    centred = mix - mix.mean()
    denom = float((centred ** 2).sum())
    lag1 = float((centred[:-1] * centred[1:]).sum() / denom) if denom > 0 else 0.0
    return {"imbalance": float(np.abs(mix - 0.5).mean()), "lag1": lag1}


def summarise(runs: dict[str, list[dict]], cfg: dict, splits: dict | None = None) -> dict:
    """Per method: rounds to target, final accuracy, queries, selection balance, speedup."""
    target, rounds = cfg["target_accuracy"], cfg["rounds"]
    summary: dict[str, dict] = {}
    for method, per_seed in runs.items():
        hit = [rounds_to_target(r["val_accuracy"], target, cfg["smooth"]) for r in per_seed]
        raw = [rounds_to_target(r["val_accuracy"], target, 1) for r in per_seed]
        censored = [h if h is not None else rounds for h in hit]
        finals = [float(np.mean(r["val_accuracy"][-cfg["final_window"]:])) for r in per_seed]
        summary[method] = {
            "rounds_to_target_per_seed": hit,
            "rounds_to_target_raw_per_seed": raw,
            "reached": sum(h is not None for h in hit),
            "rounds_to_target_mean": float(np.mean(censored)),
            "rounds_to_target_is_lower_bound": any(h is None for h in hit),
            "final_accuracy_per_seed": finals,
            "final_accuracy_mean": float(np.mean(finals)),
            "final_accuracy_std": sd(finals),
            "query_forward_passes_mean": float(np.mean([r["query_forward_passes"]
                                                        for r in per_seed])),
            "wall_s_mean": float(np.mean([r["wall_s"] for r in per_seed])),
        }
        if splits is not None:
            bal = [selection_balance(r, splits[r["seed"]]) for r in per_seed]
            summary[method]["selected_pneumonia_mix_imbalance_mean"] = float(
                np.mean([b["imbalance"] for b in bal]))
            summary[method]["selected_pneumonia_mix_lag1_autocorr_mean"] = float(
                np.mean([b["lag1"] for b in bal]))
    base = summary["uniform"]
    for s in summary.values():
        s["speedup_vs_uniform"] = base["rounds_to_target_mean"] / s["rounds_to_target_mean"]
        s["speedup_vs_uniform_per_seed"] = [
            (u if u is not None else rounds) / (h if h is not None else rounds)
            for u, h in zip(base["rounds_to_target_per_seed"], s["rounds_to_target_per_seed"])]
        s["final_minus_uniform"] = s["final_accuracy_mean"] - base["final_accuracy_mean"]
    return summary


def thresholds_table(runs: dict[str, list[dict]], cfg: dict,
                     targets: tuple[float, ...] = (0.75, 0.80, 0.85, 0.90)) -> dict:
    """Mean rounds to other targets (not reached counted as R) and how many seeds got there."""
    def hits(per_seed: list[dict], t: float) -> list[int | None]:
        return [rounds_to_target(r["val_accuracy"], t, cfg["smooth"]) for r in per_seed]

    return {f"{t:.2f}": {method: {"rounds_mean": float(np.mean([h or cfg["rounds"]
                                                               for h in hits(per_seed, t)])),
                                  "reached": sum(h is not None for h in hits(per_seed, t))}
                         for method, per_seed in runs.items()}
            for t in targets}


def _print(summary: dict, cfg: dict) -> None:
    print(f"\nPneumoniaMNIST through the product, N={cfg['num_sites']} sites "
          f"Dirichlet({cfg['alpha']}), m={cfg['m']}, d={cfg['d']}, tau={cfg['tau']}, "
          f"R={cfg['rounds']}, {cfg['seeds']} seeds; target val acc {cfg['target_accuracy']}\n")
    print("| method | rounds to target (per seed) | reached | speedup | final val acc "
          "| query fwd passes | selected mix lag-1 |")
    print("|---|---|---|---|---|---|---|")
    for method, s in summary.items():
        per = ", ".join("-" if h is None else str(h) for h in s["rounds_to_target_per_seed"])
        lb = ">=" if s["rounds_to_target_is_lower_bound"] else ""
        print(f"| {method} | {lb}{s['rounds_to_target_mean']:.1f} ({per}) | "
              f"{s['reached']}/{cfg['seeds']} | {s['speedup_vs_uniform']:.2f} | "
              f"{pm(s['final_accuracy_mean'], s['final_accuracy_std'], '.3f', sign='+-')} | "
              f"{s['query_forward_passes_mean']:.0f} | "
              f"{s['selected_pneumonia_mix_lag1_autocorr_mean']:+.2f} |")


def write(output: Path, cfg: dict, methods: list[str], splits: dict, runs: dict,
          started: float, cpu_started: float) -> None:
    """Summarise the seeds run so far (``cfg["seeds"]`` of them), write the JSON, print."""
    summary = summarise(runs, cfg, splits)
    powd, uni = summary.get("pow-d"), summary["uniform"]
    target_met = {} if powd is None else {
        "speedup": bool(powd["speedup_vs_uniform"] >= cfg["speedup_target"]),
        "final_no_worse": bool(powd["final_accuracy_mean"] >= uni["final_accuracy_mean"]),
        "uniform_reached_target_all_seeds": uni["reached"] == cfg["seeds"]}
    if target_met:
        target_met["met"] = target_met["speedup"] and target_met["final_no_worse"]
    report = {
        "benchmark": "selection_powd",
        "engine": "in-process",
        "paper": "Cho, Wang, Joshi, 'Towards Understanding Biased Client Selection in "
                 "Federated Learning', AISTATS 2022",
        "data": "PneumoniaMNIST (MedMNIST v2) class-balanced subsample, 28x28 (resized to "
                "32 px), pneumonia vs normal; sites by clients.datagen shared (Dirichlet "
                "label split), each site's val split for the curves",
        "config": dict(cfg, methods=methods,
                       task="cxr-cls (the product's small DenseNet, Adam)",
                       run_sizes=f"{cfg['seeds']} seeds x {cfg['rounds']} rounds x "
                                 f"{len(methods)} methods, {cfg['num_sites']} sites, "
                                 f"m={cfg['m']}, tau={cfg['tau']}",
                       rounds_to_target="first round whose trailing mean over `smooth` rounds "
                                        "of val-accuracy >= target_accuracy; not reached "
                                        "counts as `rounds` (lower bound)",
                       query_forward_passes="examples forwarded by the query messages (pow-d: "
                                            "each candidate's training split; cpow-d: subset)"),
        "selector_names": {m: METHODS[m] for m in methods},
        "splits": splits,
        "summary": summary,
        "other_targets": thresholds_table(runs, cfg),
        "target_met": target_met,
        "wall_s": time.perf_counter() - started,
        "cpu_s": time.process_time() - cpu_started,
        "environment": environment(),
        "runs": runs,
    }
    write_report(output, report, indent=1)
    _print(summary, cfg)
    print(f"wall {report['wall_s']:.0f} s, cpu {report['cpu_s']:.0f} s; wrote {output}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fedmed_selection"),
                        help="MLflow store of the runs")
    parser.add_argument("--data", type=Path, default=DATA, help="where the site folders go")
    for key in ("rounds", "seeds", "num_sites", "m", "d", "tau"):
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, default=CONFIG[key])
    parser.add_argument("--methods", default=",".join(METHODS))
    args = parser.parse_args(argv)
    cfg = dict(CONFIG, rounds=args.rounds, seeds=args.seeds, num_sites=args.num_sites,
               m=args.m, d=args.d, tau=args.tau)
    methods = ["uniform"] + [m for m in args.methods.split(",") if m and m != "uniform"]
    started, cpu_started = time.perf_counter(), time.process_time()
    splits, runs = {}, {m: [] for m in methods}
    for seed in range(cfg["seeds"]):
        folders = site_folders(cfg, seed, args.data)
        labels = [train_labels(f) for f in folders]
        splits[seed] = {"sizes": [int(y.size) for y in labels],
                        "pneumonia_fraction": [float(y.mean()) if y.size else 0.0
                                               for y in labels]}
        for method in methods:
            runs[method].append(run_method(method, folders, cfg, seed, args.workdir))
            r = runs[method][-1]
            print(f"seed {seed} {method:<10} final val acc "
                  f"{np.mean(r['val_accuracy'][-cfg['final_window']:]):.3f} "
                  f"queries {r['query_forward_passes']} ({r['wall_s']:.0f} s)", flush=True)
        write(args.output, dict(cfg, seeds=seed + 1), methods, splits, runs, started,
              cpu_started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
