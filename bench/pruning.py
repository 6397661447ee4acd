"""Adaptive federated pruning (PruneFL) vs dense: parameters kept, metric, seconds and bytes to target.

Issue 32, item 4, as a configuration of the product: every run is one
federation of the real ServerApp and ClientApp through the in-process engine
(:mod:`engine_runs`), its pruning chosen by the run config
(``strategy.pruning`` and the ``pruning.*`` section of PruneFL, Jiang et al.,
arXiv 1909.12326): whatever a real run does applies (the mask in the packed
downlink, compacted updates, the codec and error feedback on the kept
weights, the default norm-bound defence, the site policy).

Methods (``method`` of the JSON, :data:`pruning_sets.METHODS`): ``dense``
(``strategy.pruning = none``); ``magnitude`` (one-shot magnitude pruning of
the initial model, ``pruning.interval = 0``); ``prunefl-unstructured`` and
``prunefl-structured`` (adaptive re-pruning every ``--interval`` rounds from
the sites' summed squared gradients, of single weights or of whole output
channels); and each method of ``--codec-methods`` again with the update codec
``--codec`` (``codec`` of the JSON). ``--density`` / ``--max-density`` are
``pruning.initial-density`` / ``pruning.max-density`` of the unstructured
methods, ``--structured-density`` / ``--structured-max-density`` those of
``prunefl-structured`` (a channel density ``d`` keeps about ``d^2`` of a layer
between two pruned groups); ``--report-codec`` (``pruning.report-codec``)
encodes the sites' squared gradients, which cover every coordinate.

Before its first measured run of a set, the process runs one untimed round
of dense on it: the first federation of a process also pays torch's and the
sites' start-up, which would otherwise all fall on ``dense``.

Per seed (``per_seed``, :func:`pruning_summary.compare_seeds`): the target
is ``--fraction`` (95%) of dense's final metric (mean of the last ``--tail``
rounds) on the same seed; seconds (the round reports' wall seconds) and bytes
(up + down, all sites) until the first round at the target. ``runs``: per set
and variant, means (and sample sd) over ``--seeds``; ``goals``: the issue's
goals on those means (:func:`pruning_summary.goals`), met or not.

A study of :mod:`runner` (its shared options: ``--sets``, ``--seeds``,
``--tail``, ``--fraction``, ``--budget-seconds``, ``--resume``, ``--table``...).
Usage::

    .venv/bin/python bench/pruning.py --seeds 0 1 2
    .venv/bin/python bench/pruning.py --sets synthetic-pe --seeds 0 --rounds 6 --resume
    .venv/bin/python bench/pruning.py --table   # the markdown table of --output

Results: ``bench/results/pruning.json`` (written after every run;
``--resume`` keeps the runs already there with the same run config and adds
the missing ones).
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import BENCH  # noqa: I001

import argparse  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402

import runner  # noqa: E402
from codec_configs import parse_config  # noqa: E402
from pruning_sets import (METHODS, SETS, PruningSettings, Variant,  # noqa: E402
                          pruning_fields, pruning_set)
from pruning_summary import DENSE, compare_seeds, goals, markdown_table, summarise  # noqa: E402
from runner import Arm, Option  # noqa: E402

__all__ = ["STUDY", "variants", "arms", "main"]


def variants(methods: Sequence[str], codec: str, codec_methods: Sequence[str]) -> list[Variant]:
    """Dense first, then every method alone, then the ``codec_methods`` with ``codec``."""
    config = parse_config(codec)
    alone = [Variant(m) for m in dict.fromkeys([DENSE, *methods])]
    return alone + [Variant(m, config) for m in dict.fromkeys(codec_methods)]


def arms(args: argparse.Namespace, index: int = 0) -> list[Arm]:
    """The variants of the command line as arms (every seed runs them all)."""
    settings = PruningSettings({"unstructured": (args.density, args.max_density),
                                "structured": (args.structured_density,
                                               args.structured_max_density)},
                               args.interval, args.report_codec)
    return [Arm(v.name, v.overrides(settings), {"method": v.method, "codec": v.codec.name})
            for v in variants(args.methods, args.codec, args.codec_methods)]


def _summary(meta: dict, rows: list[dict], missing: list[str], args: argparse.Namespace) -> dict:
    per_seed = compare_seeds(rows, args.tail, args.fraction)
    runs = summarise(per_seed)
    return {"meta": meta, "runs": runs, "goals": goals(runs), "per_seed": per_seed,
            "missing": missing}


def _option(flag: str, default: object, text: str, **kwargs: object) -> Option:
    return Option(flag, {"default": default, "help": text, **kwargs})


STUDY = runner.Study(
    name="pruning", doc=__doc__, output=BENCH / "results" / "pruning.json", sets=list(SETS),
    federation=pruning_set, arms=arms,
    schedule=lambda args, dense: {"num-server-rounds": args.rounds},
    fields=pruning_fields, summary=_summary,
    table=lambda payload: markdown_table(payload["runs"]),
    rows_of=lambda payload: payload.get("per_seed", []),
    arm_key="variant", experiment="bench-pruning", baseline=DENSE, warm_up=True,
    defaults={"seeds": [0, 1, 2], "tail": 3},  # a Dice of 0.1-0.5 moves by a tenth a round
    options=(
        _option("--methods", list(METHODS), "pruning methods", nargs="+",
                choices=list(METHODS)),
        _option("--codec", "topk:0.1+ef", "update codec of the --codec-methods variants"),
        _option("--codec-methods", ["prunefl-unstructured"], "methods run with --codec too",
                nargs="*", choices=list(METHODS)),
        _option("--density", 0.15, "pruning.initial-density of the unstructured methods",
                type=float),
        _option("--max-density", 0.2, "pruning.max-density of the unstructured methods",
                type=float),
        _option("--structured-density", 0.4, "pruning.initial-density of prunefl-structured "
                "(channels)", type=float),
        _option("--structured-max-density", 0.45, "pruning.max-density of prunefl-structured",
                type=float),
        _option("--interval", 3, "pruning.interval of the prunefl methods", type=int),
        _option("--report-codec", "topk:0.05", "pruning.report-codec: codec of the sites' "
                "squared gradients"),
        _option("--rounds", 10, "rounds of every run", type=int),
        _option("--sites", 3, "sites of a set", type=int),
        _option("--steps", 0, "local steps a round (0: the set's)", type=int),
        _option("--batch-size", 0, "0: the set's", type=int)))


def main(argv: Sequence[str] | None = None) -> int:
    return runner.main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
