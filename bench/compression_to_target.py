"""Compressed FedAvg run to convergence: bytes up and down to reach 95% of dense's final metric.

Issue 17, item 4. The in-process FedAvg of ``bench/compression_fedavg.py``
(:func:`compression_loop.run_federation`: the product's ``pack_update`` /
``unpack_update``, its :class:`~strategies.compression.ErrorFeedback`, FedAvg
of the decoded updates), with the model sent down through the product's own
train instructions (:mod:`downlink_sites`): a dense packed model, or with a
downlink codec the compressed step with the server's error feedback (the
book's chapter 3, eq. 3.9) that each site applies onto the reference it holds
(checksum verified; round 1 is a dense snapshot, counted). Bytes are the
serialised sizes Flower sends (:func:`strategies.wire_bytes.wire_size`): up =
the update's ``ArrayRecord`` (the reply's metrics are not counted), down = the
whole train instruction (model or step, and its config with the downlink header).

Sets
----
``cxr``
    PneumoniaMNIST (``../shared/data/cxr2d/pneumoniamnist_balanced.npz``;
    skipped with a message if absent), 4 IID sites, the product's
    :class:`models.small_cnn.SmallCNN` with GroupNorm by default (56,481
    parameters, no buffers: with BatchNorm the running statistics travel raw,
    which caps top-k 1% at ~34x on this small model whatever the codec does;
    ``--cxr-norm bn`` runs it); local Adam lr 1e-3, batch 16, 15 steps a round;
    metric = test ROC AUC (accuracy kept in ``curves``).
``pe``
    The synthetic PE hospitals (:func:`pe_sites.find_pe_sites`, 3 sites),
    :class:`clients.pe_seg.task.PESegTask` (2.5D residual U-Net, 207,508
    parameters) on 32 px slabs, local Adam lr 3e-3, batch 8, 30 steps a
    round; metric = validation Dice.

Convergence: dense runs until :func:`bytes_to_target.flattened` (at least
``--min-rounds`` rounds and no gain above ``--min-gain`` over the best so far
in the last ``--window`` rounds), at most ``--max-rounds``; every other config
of the set and seed runs the same number of rounds from the same initial
model, with the same local training seeds per (round, site). Configs
(``compression_loop.parse_config``): dense, fp16, top-k 1% and 0.1% with and
without error feedback, sign + EF, bucketed QSGD + EF, each with and without
the downlink codec (``--downlink``, default ``topk:0.01``), and top-k 1% + EF
with the warm-up (``--warmup`` rounds) with and without it. The first seed
runs every config, further seeds the key ones (``--seed-configs``).

Per run (``runs`` of the JSON, :func:`bytes_to_target.compare`): up_ratio,
down_ratio, final_metric (mean of the last 3 rounds), relative_to_dense,
bytes_to_target_ratio (``null`` if the target is never reached), with the
curves and bytes per round; ``summary`` over seeds and ``goals`` (>= 100x up,
>= 10x down within 2% of dense; >= 50x fewer bytes to target).

Usage::

    .venv/bin/python bench/compression_to_target.py --budget-seconds 3600
    .venv/bin/python bench/compression_to_target.py --sets cxr --seeds 0 --resume

Single-threaded (``bench/single_thread.py``). Results:
``bench/results/compression_to_target.json`` (written after every run;
``--resume`` keeps the runs already there and adds the missing ones).
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
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bytes_to_target import compare, flattened, goals, markdown_table, summarise  # noqa: E402
from compression_loop import CodecConfig, parse_config, run_federation  # noqa: E402
from compression_tasks import CXRTask, PETask  # noqa: E402
from model_arrays import state_arrays  # noqa: E402
from pe_sites import find_pe_sites  # noqa: E402
from pneumoniamnist import DEFAULT_PATH, load_pneumoniamnist  # noqa: E402
from strategies.update_codec import dense_bytes  # noqa: E402

__all__ = ["SETS", "PRIMARY", "default_configs", "key_configs", "run_row", "main"]

DEFAULT_OUTPUT = BENCH / "results" / "compression_to_target.json"
SETS = ("cxr", "pe")
#: The metric each set's bytes-to-target and final metric are read on.
PRIMARY = {"cxr": "auc", "pe": "dice"}
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


def run_row(set_name: str, seed: int, task, config: CodecConfig, result, fp32: int) -> dict:
    """The JSON row of one run (before :func:`bytes_to_target.compare` adds the ratios)."""
    metric = PRIMARY[set_name]
    return {
        "set": set_name, "seed": seed, "config": config.name, "label": config.label,
        "uplink": config.spec, "error_feedback": config.error_feedback,
        "downlink": config.downlink, "warmup_rounds": config.warmup_rounds,
        "rounds": len(result.bytes_up), "metric": metric, "curve": result.metrics[metric],
        "curves": {m: result.metrics[m] for m in task.metrics},
        "bytes_up_per_round": [int(sum(b)) for b in result.bytes_up],
        "bytes_down_per_round": [int(sum(b)) for b in result.bytes_down_sites],
        "up_bytes_per_site_round": float(np.mean(result.bytes_up)),
        "down_bytes_per_site_round": float(np.mean(result.bytes_down_sites)),
        "dense_fp32_bytes": fp32, "residual_norm": result.residual_norm,
        "seconds": result.seconds, "cpu_seconds": result.cpu_seconds,
    }


def _task(name: str, seed: int, args, pe_dirs: list[Path]):
    if name == "cxr":
        return CXRTask(load_pneumoniamnist(args.cxr_data), num_sites=args.cxr_sites, seed=seed,
                       lr=args.cxr_lr, batch_size=args.cxr_batch_size, norm=args.cxr_norm,
                       name="cxr")
    return PETask(pe_dirs, image_size=args.pe_image_size, lr=args.pe_lr)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--configs", nargs="+", default=None,
                        help="configs of the first seed (default: every one, key ones first)")
    parser.add_argument("--seed-configs", nargs="+", default=None,
                        help="configs of the further seeds (default: the key ones)")
    parser.add_argument("--downlink", default="topk:0.01")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--max-rounds", type=int, default=40)
    parser.add_argument("--min-rounds", type=int, default=10)
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--min-gain", type=float, default=0.005)
    parser.add_argument("--tail", type=int, default=3, help="final = mean of the last N rounds")
    parser.add_argument("--fraction", type=float, default=0.95, help="target = this x dense")
    parser.add_argument("--budget-seconds", type=float, default=None,
                        help="start no run after this many seconds (default: no limit)")
    parser.add_argument("--cxr-data", type=Path, default=DEFAULT_PATH)
    parser.add_argument("--cxr-sites", type=int, default=4)
    parser.add_argument("--cxr-steps", type=int, default=15)
    parser.add_argument("--cxr-batch-size", type=int, default=16)
    parser.add_argument("--cxr-lr", type=float, default=1e-3)
    parser.add_argument("--cxr-norm", choices=["gn", "bn"], default="gn")
    parser.add_argument("--pe-data-root", type=Path, default=None)
    parser.add_argument("--pe-steps", type=int, default=30)
    parser.add_argument("--pe-image-size", type=int, default=32)
    parser.add_argument("--pe-lr", type=float, default=3e-3)
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


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    torch.set_num_threads(1)
    first = [parse_config(c) for c in (args.configs or default_configs(args.downlink,
                                                                        args.warmup))]
    further = [parse_config(c) for c in (args.seed_configs or key_configs(args.downlink,
                                                                           args.warmup))]
    started = time.perf_counter()
    meta = {"benchmark": "compression_to_target", "description": __doc__.split("\n\n")[0],
            "setup": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "skipped": {}, "versions": {"python": platform.python_version(),
                                        "numpy": np.__version__, "torch": torch.__version__}}
    previous = json.loads(args.output.read_text()) if args.resume and \
        args.output.is_file() else {}
    rows = previous.get("runs", [])
    meta["commands"] = previous.get("commands", []) + [
        list(sys.argv[1:] if argv is None else argv)]
    done = {(r["set"], r["seed"], r["config"]) for r in rows}
    missing: list[str] = []
    stop = partial(flattened, window=args.window, min_gain=args.min_gain,
                   min_rounds=args.min_rounds)
    with tempfile.TemporaryDirectory(prefix="compression-to-target-") as tmp:
        pe_dirs = find_pe_sites(args.pe_data_root, Path(tmp), 0)[0] if "pe" in args.sets else []
        for index, seed in enumerate(args.seeds):
            for name in args.sets:
                if name == "cxr" and not args.cxr_data.is_file():
                    meta["skipped"][name] = f"{args.cxr_data} not found (real data is optional)"
                    print(f"[cxr] skipped: {meta['skipped'][name]}", flush=True)
                    continue
                task, cache = _task(name, seed, args, pe_dirs), {}
                steps = args.cxr_steps if name == "cxr" else args.pe_steps
                torch.manual_seed(seed)
                fp32 = dense_bytes(state_arrays(task.build_model()))
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
                    result = run_federation(
                        task, config, dense["rounds"] if dense else args.max_rounds, steps,
                        seed, cache=cache, instructions=True,
                        stop=None if dense else lambda m, n=name: stop(m[PRIMARY[n]]))
                    rows.append(run_row(name, seed, task, config, result, fp32))
                    done.add((name, seed, config.name))
                    row = compare(rows, args.tail, args.fraction)[-1]
                    reached = row["bytes_to_target_ratio"]
                    print(f"[{name} seed {seed}] {config.name:<40} {row['rounds']:3d} rounds "
                          f"{result.seconds:6.1f} s  up x{row['up_ratio']:.1f} down "
                          f"x{row['down_ratio']:.1f}  final {row['final_metric']:.3f} "
                          f"({row['relative_to_dense']:.3f} of dense)  to target "
                          + (f"x{reached:.1f}" if reached else "never"), flush=True)
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
