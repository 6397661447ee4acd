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

A study of :mod:`runner` (its shared options: ``--sets``, ``--seeds``,
``--tail``, ``--fraction``, ``--budget-seconds``, ``--resume``, ``--table``...).
Usage::

    .venv/bin/python bench/compression_to_target.py --sets cxr pe --seeds 0
    .venv/bin/python bench/compression_to_target.py --sets pe --seeds 1 --resume

Results: ``bench/results/compression_to_target.json`` (written after every
run; ``--resume`` keeps the runs already there with the same run config and
adds the missing ones).
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import BENCH  # noqa: I001

import argparse  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402

import runner  # noqa: E402
from bytes_to_target import compare, goals, markdown_table, summarise  # noqa: E402
from codec_configs import CodecConfig, parse_config  # noqa: E402
from compression_sets import SET_OPTIONS, codec_arm, codec_fields, compression_set  # noqa: E402
from runner import Arm, Option  # noqa: E402

__all__ = ["STUDY", "SETS", "default_configs", "key_configs", "arms", "main"]

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


def arms(args: argparse.Namespace, index: int) -> list[Arm]:
    """Dense, then the ``--configs`` (first seed) or ``--seed-configs`` (further seeds)."""
    names = (args.configs or default_configs(args.downlink, args.warmup)) if index == 0 else \
        (args.seed_configs or key_configs(args.downlink, args.warmup))
    configs = [CodecConfig("none", False)] + [
        c for c in map(parse_config, names) if c.name != "none"]
    return [codec_arm(c) for c in configs]


def schedule(args: argparse.Namespace, dense: dict | None) -> dict:
    """Dense: ``--max-rounds`` under the product's early stopping; the others: dense's rounds."""
    return {"num-server-rounds": dense["rounds"] if dense else args.max_rounds,
            "early-stopping.patience": 0 if dense else args.patience,
            "early-stopping.min-delta": args.min_delta}


def _summary(meta: dict, rows: list[dict], missing: list[str], args: argparse.Namespace) -> dict:
    runs = compare(rows, args.tail, args.fraction)
    summary = summarise(runs)
    return {**meta, "runs": runs, "summary": summary, "goals": goals(summary),
            "missing": missing}


STUDY = runner.Study(
    name="compression_to_target", doc=__doc__,
    output=BENCH / "results" / "compression_to_target.json", sets=SETS,
    federation=compression_set, arms=arms, schedule=schedule, fields=codec_fields,
    summary=_summary, table=lambda payload: markdown_table(payload["summary"]),
    rows_of=lambda payload: payload.get("runs", []), arm_key="config",
    experiment="bench-compression", baseline="none",
    options=(Option("--configs", {"nargs": "+", "default": None, "help": "configs of the first "
                                  "seed (default: every one, key ones first)"}),
             Option("--seed-configs", {"nargs": "+", "default": None, "help": "configs of the "
                                       "further seeds (default: the key ones)"}),
             Option("--downlink", {"default": "topk:0.01"}),
             Option("--warmup", {"type": int, "default": 2}),
             Option("--max-rounds", {"type": int, "default": 6}),
             Option("--patience", {"type": int, "default": 0, "help": "dense: the product's "
                                   "early-stopping.patience (0 = off)"}),
             Option("--min-delta", {"type": float, "default": 0.005}), *SET_OPTIONS))


def main(argv: Sequence[str] | None = None) -> int:
    return runner.main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
