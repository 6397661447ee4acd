"""Compressed FedAvg run to convergence: bytes up and down to reach 95% of dense's final metric.

Issue 17, item 4, as a configuration of the product (issue 27): every run is
one federation of the real ServerApp and ClientApp through the in-process
engine (:mod:`engine_runs`), the codec chosen by the run config
(:class:`codec_configs.CodecConfig`: ``strategy.codec``,
``strategy.error-feedback``, ``strategy.downlink-codec``,
``strategy.codec-warmup-rounds``). Everything a real run does applies: the
site's encoding and error feedback, the reply intake, the default norm-bound
defence, the size caps, the downlink (a compressed downlink starts with a
dense snapshot, counted), the site policy. Bytes are the round reports'
``traffic``: up = each site's serialised reply, down = its whole train
instruction (model or step, and its config).

Sets
----
``cxr``
    PneumoniaMNIST converted once by ``python -m clients.datagen shared --task
    cxr-cls --set pneumoniamnist --scheme iid --sites 4 --seed 0`` (skipped
    with a message if ``../shared/data`` lacks it); the product's cxr-cls task
    (small DenseNet, ``image-size`` 32); local Adam lr 1e-3, batch 16;
    metric = validation ROC AUC (``val-auc``, example-weighted over sites).
``pe``
    The synthetic PE hospitals (``python -m clients.datagen synthetic --task
    pe-seg --sites 3 --seed 0 --image-size 96``), the pe-seg task (2.5D
    residual U-Net) on 32 px slabs, local Adam lr 3e-3, batch 8; metric =
    validation Dice (``val-dice``).

Rounds: dense runs ``--max-rounds`` rounds, stopped earlier by the product's
early stopping when ``--patience`` > 0 (``early-stopping.patience``,
``early-stopping.min-delta``); every other config of the set and seed runs as
many rounds from the same initial model (the run config's ``seed``), with the
same local training seeds per (round, site) (the product's site seed). The
first seed runs every ``--configs``, further seeds the ``--seed-configs``.

Per run (``runs`` of the JSON, :func:`bytes_to_target.compare`): up_ratio,
down_ratio, final_metric (mean of the last ``--tail`` rounds),
relative_to_dense, bytes_to_target_ratio (``null`` if the target is never
reached), with the curves and bytes per round; ``summary`` over seeds and
``goals`` (>= 100x up, >= 10x down within 2% of dense; >= 50x fewer bytes to
target).

Usage::

    .venv/bin/python bench/compression_to_target.py --sets cxr pe --seeds 0
    .venv/bin/python bench/compression_to_target.py --sets pe --seeds 1 --resume

Results: ``bench/results/compression_to_target.json`` (written after every
run; ``--resume`` keeps the runs already there and adds the missing ones).
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import BENCH  # noqa: I001

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from bytes_to_target import (add_target_arguments, compare, goals,  # noqa: E402
                             markdown_table, summarise)
from codec_configs import CodecConfig, parse_config  # noqa: E402
from compression_sets import add_set_arguments, codec_run, compression_set  # noqa: E402

__all__ = ["SETS", "default_configs", "key_configs", "main"]

DEFAULT_OUTPUT = BENCH / "results" / "compression_to_target.json"
SETS = ("cxr", "pe")
UPLINKS = ("none", "fp16", "topk:0.01+ef", "topk:0.01", "topk:0.001+ef", "topk:0.001",
           "sign+ef", "qsgd:16:b512+ef")


def key_configs(downlink: str, warmup: int) -> list[str]:
    """The configs every seed runs: dense, top-k 1% + EF with and without the downlink
    codec and with the warm-up, top-k 0.1% + EF, bucketed QSGD + EF."""
    return ["none", "topk:0.01+ef", f"topk:0.01+ef down={downlink}", "topk:0.001+ef",
            f"topk:0.001+ef down={downlink}", "qsgd:16:b512+ef",
            f"topk:0.01+ef down={downlink} warmup={warmup}"]


def default_configs(downlink: str, warmup: int) -> list[str]:
    """Every config of the issue, the key ones first."""
    every = [u + suffix for u in UPLINKS for suffix in ("", f" down={downlink}")]
    every += [f"topk:0.01+ef warmup={warmup}"]
    key = key_configs(downlink, warmup)
    return key + [c for c in every if c not in key]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--configs", nargs="+", default=None,
                        help="configs of the first seed (default: every one, key ones first)")
    parser.add_argument("--seed-configs", nargs="+", default=None,
                        help="configs of the further seeds (default: the key ones)")
    parser.add_argument("--downlink", default="topk:0.01")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--max-rounds", type=int, default=6)
    parser.add_argument("--patience", type=int, default=0,
                        help="dense: the product's early-stopping.patience (0 = off)")
    parser.add_argument("--min-delta", type=float, default=0.005)
    add_target_arguments(parser)
    add_set_arguments(parser)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--resume", action="store_true", help="keep the runs already in --output")
    return parser


def _write(path: Path, meta: dict, rows: list[dict], missing: list[str]) -> list[dict]:
    runs = compare(rows, meta["setup"]["tail"], meta["setup"]["fraction"])
    summary = summarise(runs)
    out = {**meta, "runs": runs, "summary": summary, "goals": goals(summary),
           "missing": missing}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    return summary


def _report(row: dict) -> None:
    reached = row["bytes_to_target_ratio"]
    print(f"[{row['set']} seed {row['seed']}] {row['config']:<40} {row['rounds']:3d} rounds "
          f"{row['seconds']:6.1f} s  up x{row['up_ratio']:.1f} down x{row['down_ratio']:.1f}  "
          f"final {row['final_metric']:.3f} ({row['relative_to_dense']:.3f} of dense)  "
          "to target " + (f"x{reached:.1f}" if reached else "never"), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    first = [parse_config(c) for c in (args.configs or default_configs(args.downlink,
                                                                        args.warmup))]
    further = [parse_config(c) for c in (args.seed_configs or key_configs(args.downlink,
                                                                           args.warmup))]
    for config in first + further:  # the product refuses a bad setting before any run
        config.check()
    started = time.perf_counter()
    meta = {"benchmark": "compression_to_target", "description": __doc__.split("\n\n")[0],
            "engine": "in-process",
            "setup": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "skipped": {}, "versions": {"python": platform.python_version(),
                                        "numpy": np.__version__}}
    previous = json.loads(args.output.read_text()) if args.resume and \
        args.output.is_file() else {}
    rows = previous.get("runs", [])
    meta["commands"] = previous.get("commands", []) + [
        list(sys.argv[1:] if argv is None else argv)]
    done = {(r["set"], r["seed"], r["config"]) for r in rows}
    missing: list[str] = []
    with tempfile.TemporaryDirectory(prefix="compression-to-target-") as tmp:
        workdir = args.workdir or Path(tmp)
        for index, seed in enumerate(args.seeds):
            for name in args.sets:
                federation = compression_set(name, args)
                if federation is None:
                    meta["skipped"][name] = f"{args.shared_data}: PneumoniaMNIST not found"
                    print(f"[{name}] skipped: {meta['skipped'][name]}", flush=True)
                    continue
                configs = [CodecConfig("none", False)] + [
                    c for c in (first if index == 0 else further) if c.name != "none"]
                for config in configs:
                    dense = next((r for r in rows if (r["set"], r["seed"], r["config"])
                                  == (name, seed, "none")), None)
                    if (name, seed, config.name) in done:
                        continue
                    if (args.budget_seconds is not None and time.perf_counter() - started
                            > args.budget_seconds) or (dense is None and config.name != "none"):
                        missing.append(f"{name} seed {seed} {config.name}")
                        continue
                    rows.append(codec_run(
                        federation, config, seed, dense["rounds"] if dense else args.max_rounds,
                        workdir, patience=0 if dense else args.patience,
                        min_delta=args.min_delta))
                    done.add((name, seed, config.name))
                    _report(compare(rows, args.tail, args.fraction)[-1])
                    _write(args.output, meta, rows, missing)
    meta["wall_seconds"] = time.perf_counter() - started
    summary = _write(args.output, meta, rows, missing)
    print("\n" + markdown_table(summary))
    if missing:
        print(f"\nnot run ({len(missing)}): " + "; ".join(missing))
    print(f"\nresults in {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
