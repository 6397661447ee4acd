"""Update compression in FedAvg: uplink bytes on the real wire format vs final model quality.

The accuracy half of the compression issue (the throughput half is
``bench/codec_throughput.py``), as a configuration of the product (issue 27):
every config is one federation of the real ServerApp and ClientApp through
the in-process engine (:func:`compression_sets.codec_run`), the codec chosen
by the run config (``strategy.codec``, ``strategy.error-feedback``). The
site encodes its update with its error feedback kept across rounds (EF-SGD:
``z = e + delta``, send ``C(z)``, ``e <- z - decode(C(z))``), the server's
reply intake decodes it, the default norm-bound defence and FedAvg apply,
and the bytes are the round reports' ``traffic`` (up = the serialised reply,
down = the whole train instruction; the downlink is dense).

Sets (:mod:`compression_sets`): ``pe`` (synthetic PE hospitals, 2.5D U-Net,
32 px, Adam; validation Dice) and ``cxr`` (PneumoniaMNIST over 4 IID
sites, the cxr-cls task's small DenseNet at 32 px, Adam; validation AUC and
accuracy; skipped if ``../shared/data`` lacks it).

Configs (:data:`codec_configs.CONFIGS`): ``none``; ``topk:0.1``,
``topk:0.01``, ``topk:0.001`` each with and without error feedback;
``qsgd:16 +EF``; ``sign +EF``. Every config starts from the same initial
model with the same local training seeds per (round, site) (``seed``).

Summary per config (:mod:`compression_summary`): mean uplink bytes per site
per round, downlink bytes, uplink ratio vs dense, final metric = mean of the
last ``--tail`` rounds, relative difference vs dense. Targets of the issue:
(a) ``topk:0.01 +EF`` sends >= 100x fewer uplink bytes than dense with a
final metric at most 2% (relative) below; (b) for each top-k fraction,
``+EF`` ends higher than ``no EF``.

Usage::

    .venv/bin/python bench/compression_fedavg.py --sets pe --rounds 4
    .venv/bin/python bench/compression_fedavg.py --sets cxr --configs none topk:0.01+ef topk:0.01

Results: ``bench/results/compression_fedavg.json``.
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import BENCH  # noqa: I001

import argparse  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

from codec_configs import CONFIGS, parse_config  # noqa: E402
from compression_sets import PRIMARY, add_set_arguments, codec_run, compression_set  # noqa: E402
from compression_summary import markdown_table, summarise, targets_text  # noqa: E402
from report import write_report  # noqa: E402

__all__ = ["SETS", "main"]

DEFAULT_OUTPUT = BENCH / "results" / "compression_fedavg.json"
SETS = ("pe", "cxr")
#: The metrics each set reports (the primary one first).
METRICS = {"pe": ("dice",), "cxr": ("auc", "accuracy")}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    parser.add_argument("--configs", nargs="+", default=None,
                        help="subset, e.g. none topk:0.01+ef topk:0.01 (default: all nine)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tail", type=int, default=2, help="final = mean of the last N rounds")
    add_set_arguments(parser)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    configs = [parse_config(c) for c in args.configs] if args.configs else list(CONFIGS)
    for config in configs:  # the product refuses a bad setting before any run
        config.check()
    started = time.perf_counter()
    out: dict = {
        "benchmark": "compression_fedavg", "engine": "in-process",
        "description": __doc__.split("\n\n")[0],
        "bytes": "round reports' traffic: up = serialised reply, down = the whole train "
                 "instruction (dense downlink), per site and round; ratio = mean up of "
                 "'none' / mean up of the config",
        "final_metric": f"mean of the last {args.tail} rounds",
        "targets": {"a": "topk:0.01+ef uplink ratio >= 100 and final metric >= dense * 0.98",
                    "b": "for every top-k fraction, +EF final metric > no-EF final metric"},
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "configs": [c.name for c in configs], "tasks": {},
    }
    with tempfile.TemporaryDirectory(prefix="compression-fedavg-") as tmp:
        workdir = args.workdir or Path(tmp)
        for name in args.sets:
            federation = compression_set(name, args)
            if federation is None:
                out["tasks"][name] = {"skipped": f"{args.shared_data}: PneumoniaMNIST not found"}
                print(f"[{name}] {out['tasks'][name]['skipped']}", flush=True)
                continue
            rows = []
            for config in configs:
                rows.append(codec_run(federation, config, args.seed, args.rounds, workdir))
                print(f"[{name}] {config.label:<20} {rows[-1]['seconds']:6.1f} s  up "
                      f"{rows[-1]['up_bytes_per_site_round']:>10,.0f} B/site/round  "
                      f"{PRIMARY[name]} {rows[-1]['curve'][-1]:.3f}", flush=True)
            summary = summarise(name, METRICS[name], rows, args.tail)
            out["tasks"][name] = {
                "setup": {"rounds": args.rounds, "sites": len(federation.folders),
                          "run_config": federation.overrides},
                "summary": summary, "curves": {r["config"]: r for r in rows}}
            print(f"\n### {name}: {args.rounds} rounds, {len(federation.folders)} sites\n\n"
                  + markdown_table(summary) + "\n\n" + targets_text(summary), flush=True)
    out["wall_seconds"] = time.perf_counter() - started
    out["versions"] = {"python": platform.python_version()}
    write_report(args.output, out, indent=1)
    print(f"\nwall time {out['wall_seconds']:.0f} s; results in {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
