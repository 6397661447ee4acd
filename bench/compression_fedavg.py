"""Update compression in FedAvg: uplink bytes on the real wire format vs final model quality.

The accuracy half of the compression issue (the throughput half is
``bench/codec_throughput.py``), as a configuration of the product (issue 27):
every config is one federation of the real ServerApp and ClientApp through
the in-process engine (a study of :mod:`runner`), the codec chosen
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

Results: ``bench/results/compression_fedavg.json`` (``--resume`` keeps its runs
with the same run config).
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import BENCH  # noqa: I001

import argparse  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402

import runner  # noqa: E402
from codec_configs import CONFIGS, parse_config  # noqa: E402
from compression_sets import SET_OPTIONS, codec_arm, codec_fields, compression_set  # noqa: E402
from compression_summary import markdown_table, summarise, targets_text  # noqa: E402
from runner import Arm, Option  # noqa: E402
from stats import group  # noqa: E402

__all__ = ["STUDY", "SETS", "arms", "main"]

SETS = ("pe", "cxr")
#: The metrics each set reports (the primary one first).
METRICS = {"pe": ("dice",), "cxr": ("auc", "accuracy")}
BYTES = ("round reports' traffic: up = serialised reply, down = the whole train instruction "
         "(dense downlink), per site and round; ratio = mean up of 'none' / mean up of the "
         "config")
TARGETS = {"a": "topk:0.01+ef uplink ratio >= 100 and final metric >= dense * 0.98",
           "b": "for every top-k fraction, +EF final metric > no-EF final metric"}


def arms(args: argparse.Namespace, index: int = 0) -> list[Arm]:
    """The ``--configs`` (default: :data:`codec_configs.CONFIGS`) as arms."""
    configs = [parse_config(c) for c in args.configs] if args.configs else list(CONFIGS)
    return [codec_arm(c) for c in configs]


def _summary(meta: dict, rows: list[dict], missing: list[str], args: argparse.Namespace) -> dict:
    tasks: dict = {name: {"skipped": reason} for name, reason in meta["skipped"].items()}
    for name, mine in group(rows, lambda r: r["set"]).items():
        tasks[name] = {"setup": {"rounds": args.rounds, "sites": mine[0]["sites"],
                                 "run_config": meta["sets"].get(name)},
                       "summary": summarise(name, METRICS[name], mine, args.tail),
                       "curves": {r["config"]: r for r in mine}}
    return {"benchmark": meta["benchmark"], "engine": meta["engine"],
            "description": meta["description"], "bytes": BYTES,
            "final_metric": f"mean of the last {args.tail} rounds", "targets": TARGETS,
            "config": meta["setup"], "configs": [a.name for a in arms(args)], "tasks": tasks,
            "commands": meta["commands"], "versions": meta["versions"],
            "wall_seconds": meta.get("wall_seconds"), "missing": missing}


def _table(payload: dict) -> str:
    return "\n\n".join(
        f"### {name}: {task['setup']['rounds']} rounds, {task['setup']['sites']} sites\n\n"
        + markdown_table(task["summary"]) + "\n\n" + targets_text(task["summary"])
        for name, task in payload["tasks"].items() if "summary" in task)


STUDY = runner.Study(
    name="compression_fedavg", doc=__doc__, output=BENCH / "results" / "compression_fedavg.json",
    sets=SETS, federation=compression_set, arms=arms,
    schedule=lambda args, dense: {"num-server-rounds": args.rounds,
                                  "early-stopping.patience": 0, "early-stopping.min-delta": 0.0},
    fields=codec_fields, summary=_summary, table=_table,
    rows_of=lambda payload: [r for task in payload.get("tasks", {}).values()
                             for r in task.get("curves", {}).values()],
    arm_key="config", experiment="bench-compression",
    options=(Option("--configs", {"nargs": "+", "default": None, "help": "subset, e.g. none "
                                  "topk:0.01+ef topk:0.01 (default: all nine)"}),
             runner.SINGLE_SEED,
             Option("--rounds", {"type": int, "default": 4}), *SET_OPTIONS))


def main(argv: Sequence[str] | None = None) -> int:
    return runner.main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
