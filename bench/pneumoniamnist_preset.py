"""The PneumoniaMNIST preset's federation against pooled training (issue 34, item 4).

A configuration of the product: the run config is ``configs/cxr-cls-pneumoniamnist-best.toml``
(``--preset``; ``--set key=value`` overrides a key while exploring), run by the in-process
engine (:func:`engine_runs.run_product`) on site folders written by the product's converter:
PneumoniaMNIST (``../shared/data/cxr2d/pneumoniamnist_balanced.npz``, 28 px, class-balanced)
dealt to 3 sites with a Dirichlet(0.5) label skew, converter seed 0.

Two regimes, each a list of nodes of one federation:

``federated``
    The 3 sites train; two evaluate-only nodes measure: ``pooled`` (every site's items, its
    ``val`` split is all the sites' validation radiographs) and ``pooled-test`` (its test
    view, :func:`server_optimizer_sets.test_view`: its ``val`` rows are all the sites'
    ``test`` rows, which together are MedMNIST's whole test split).
``pooled``
    Centralised training under the same budget: ``pooled`` trains the same rounds with
    3 x the local steps (the federation's total), ``pooled-test`` measures.

Per run it reports, after the last round (never a best round: the test view's metric must
not choose a model), ``val_auc`` (``pooled``'s evaluate reply: the validation AUC settings
are chosen on) and ``test_auc`` (``pooled-test``'s). ``mean`` / ``sd`` are over the
federated seeds, ``pooled_mean`` / ``pooled_sd`` over the pooled ones; ``reached``:
``mean >= target`` (0.962, MedMNIST v2's ResNet-50 at 224 px, trained centrally). Usage::

    python bench/pneumoniamnist_preset.py                 # 3 seeds of each regime
    python bench/pneumoniamnist_preset.py --seeds 0 --regimes federated --set lr=0.001
    python bench/pneumoniamnist_preset.py --quick         # wiring check, seconds
    python bench/pneumoniamnist_preset.py --reuse earlier.json  # runs only what it lacks

The pooled run uses the preset's whole run config (its server optimizer steps over the one
site's update).
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import ROOT  # noqa: I001

import argparse  # noqa: E402
import csv  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import tomllib  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from engine_runs import SHARED, run_product  # noqa: E402
from federation_sites import convert_shared, folder_sites, pooled_folder  # noqa: E402
from report import Column, environment, print_table, write_report  # noqa: E402
from server_optimizer_sets import test_view  # noqa: E402
from stats import at_least, mean_sd  # noqa: E402

__all__ = ["PRESET", "TARGET", "build_nodes", "run_regime", "reused", "main"]

PRESET = ROOT / "configs" / "cxr-cls-pneumoniamnist-best.toml"
DEFAULT_OUTPUT = ROOT / "bench" / "results" / "pneumoniamnist_preset.json"
#: MedMNIST v2's ResNet-50 (224 px) test AUC on PneumoniaMNIST, trained centrally.
TARGET = 0.962
#: The converter's arguments: 3 sites, Dirichlet(0.5) label skew, split seed 0.
CONVERTER_ARGS = ("--set", "pneumoniamnist", "--scheme", "dirichlet", "--alpha", "0.5",
                  "--sites", "3", "--seed", "0")
#: ``--quick``: a few items per site, 2 rounds of 2 steps, one seed.
QUICK = {"num-server-rounds": 2, "local-steps": 2}


def build_nodes(shared: Path, out: Path, max_per_site: int = 0) -> tuple[list[Path], Path, Path]:
    """The 3 site folders, the pooled folder and its test view, written under ``out``."""
    capped = ("--max-per-site", str(max_per_site)) if max_per_site else ()
    sites = convert_shared("cxr-cls", shared, out / "sites", [*CONVERTER_ARGS, *capped])
    pooled = pooled_folder(sites, out / "pooled" / "pooled")
    return sites, pooled, test_view(pooled, out / "tests" / "pooled-test")


def split_count(folder: Path, split: str) -> int:
    """Rows of ``split`` in ``folder``'s ``images.csv``."""
    with (folder / "images.csv").open(newline="") as f:
        return sum(row["split"] == split for row in csv.DictReader(f))


def run_regime(regime: str, config: dict[str, Any], seed: int, sites: Sequence[Path],
               pooled: Path, test: Path, workdir: Path) -> dict[str, Any]:
    """One run of ``regime`` (``federated`` | ``pooled``) with ``seed``; its row."""
    steps = int(config["local-steps"])
    if regime == "pooled":
        trained, measuring, steps = [pooled], [test], steps * len(sites)
    else:
        trained, measuring = list(sites), [pooled, test]
    workdir.mkdir(parents=True, exist_ok=True)
    nodes = folder_sites([*trained, *measuring], evaluate_only=measuring,
                         state_root=Path(tempfile.mkdtemp(prefix="state-", dir=workdir)))
    run = {**config, "seed": seed, "local-steps": steps, "min-nodes": len(nodes),
           "experiment": f"bench-pneumoniamnist-preset-{regime}"}
    outcome, seconds = run_product(run, nodes, workdir)
    last = outcome.reports[max(outcome.reports)]
    if not set(last.train) & {p.name for p in trained}:
        raise RuntimeError(f"{regime} seed {seed}: no train reply accepted in the last round "
                           f"({dict(last.train_dropped)})")
    return {"regime": regime, "seed": seed, "test_auc": last.evaluate[test.name]["val-auc"],
            "val_auc": last.evaluate[pooled.name]["val-auc"], "wall_seconds": round(seconds, 1),
            "local_steps": steps}


def reused(outputs: Sequence[Path], config: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs of earlier ``outputs`` measured with ``config``, first run of a (regime, seed)
    kept.

    Raises
    ------
    ValueError
        Naming the file, when its settings are not ``config``.
    """
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    for output in outputs:
        earlier = json.loads(output.read_text())
        if earlier["settings"] != config or earlier.get("quick"):
            raise ValueError(f"{output}: measured with other settings ({earlier['settings']}), "
                             f"not {config}")
        for run in earlier["runs"]:
            runs.setdefault((run["regime"], run["seed"]), run)
    return list(runs.values())


def _override(text: str) -> tuple[str, Any]:
    """``key=value`` with ``value`` read as TOML (``lr=0.001``, ``optimizer="sgd"`` or
    ``optimizer=sgd``)."""
    key, _, value = text.partition("=")
    try:
        return key, tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return key, value


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the regimes and seeds, write the JSON report; the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", type=Path, default=PRESET)
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a run-config key of the preset")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--regimes", nargs="+", default=["federated", "pooled"],
                        choices=["federated", "pooled"])
    parser.add_argument("--pooled-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--shared", type=Path, default=SHARED)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--reuse", type=Path, action="append", default=[],
                        help="keep the runs of this earlier output measured with the same "
                             "settings (a seed and regime there is not run again)")
    parser.add_argument("--quick", action="store_true",
                        help="wiring check: 30 items per site, 2 rounds x 2 steps, seed 0")
    args = parser.parse_args(argv)
    with args.preset.open("rb") as handle:
        config = tomllib.load(handle)
    config.update(dict(_override(o) for o in args.overrides))
    seeds, pooled_seeds = args.seeds, args.pooled_seeds
    if args.quick:
        config.update(QUICK)
        seeds, pooled_seeds = [0], [0]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pneumoniamnist-preset-") as tmp:
        sites, pooled, test = build_nodes(args.shared, Path(tmp), 30 if args.quick else 0)
        test_items = split_count(pooled, "test")
        runs = reused(args.reuse, config)
        done = {(r["regime"], r["seed"]) for r in runs}
        for regime in args.regimes:
            for seed in (seeds if regime == "federated" else pooled_seeds):
                if (regime, seed) in done:
                    continue
                runs.append(run_regime(regime, config, seed, sites, pooled, test,
                                       Path(tmp) / "runs"))
                print(f"[{regime} seed {seed}] val {runs[-1]['val_auc']:.4f} test "
                      f"{runs[-1]['test_auc']:.4f} ({runs[-1]['wall_seconds']} s)", flush=True)
    mean, sd = mean_sd(r["test_auc"] for r in runs if r["regime"] == "federated")
    pooled_mean, pooled_sd = mean_sd(r["test_auc"] for r in runs if r["regime"] == "pooled")
    report = {
        "description": "PneumoniaMNIST, 3 Dirichlet(0.5) sites: the preset's federation vs "
                       "pooled training under the same total local steps; held-out test AUC "
                       "on the whole MedMNIST test split after the last round",
        "runs": runs, "mean": mean, "sd": sd, "target": TARGET,
        "reached": at_least(mean, TARGET), "pooled_mean": pooled_mean, "pooled_sd": pooled_sd,
        "test_items": test_items, "settings": config,
        "preset": str(args.preset.resolve().relative_to(ROOT)) if args.preset.resolve()
        .is_relative_to(ROOT) else str(args.preset),
        "quick": args.quick, "machine": {**environment(), "device": "cpu"},
        "command": "python bench/pneumoniamnist_preset.py " + " ".join(sys.argv[1:]
                                                                      if argv is None else argv),
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    write_report(args.output, report)
    print_table("PneumoniaMNIST preset: held-out test AUC after the last round", [
        Column("regime", "<10", lambda r: r["regime"]), Column("seed", ">4", lambda r: r["seed"]),
        Column("val AUC", ">8.4f", lambda r: r["val_auc"]),
        Column("test AUC", ">8.4f", lambda r: r["test_auc"]),
        Column("wall s", ">7.1f", lambda r: r["wall_seconds"])], runs)
    return report


if __name__ == "__main__":
    main()
