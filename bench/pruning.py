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

Usage::

    .venv/bin/python bench/pruning.py --seeds 0 1 2
    .venv/bin/python bench/pruning.py --sets synthetic-pe --seeds 0 --rounds 6 --resume
    .venv/bin/python bench/pruning.py --table   # the markdown table of --output

Results: ``bench/results/pruning.json`` (written after every run;
``--resume`` keeps the runs already there and adds the missing ones).
"""

from __future__ import annotations

# First: one BLAS/OpenMP thread before numpy/torch load, and the project importable.
from single_thread import BENCH  # noqa: I001

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

from bytes_to_target import add_target_arguments  # noqa: E402
from codec_configs import parse_config  # noqa: E402
from pruning_sets import (METHODS, SETS, PruningSettings, Variant,  # noqa: E402
                          add_set_arguments, pruning_run, pruning_set)
from pruning_summary import DENSE, compare_seeds, goals, markdown_table, summarise  # noqa: E402
from report import environment, write_report  # noqa: E402

__all__ = ["variants", "main"]

DEFAULT_OUTPUT = BENCH / "results" / "pruning.json"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--codec", default="topk:0.1+ef",
                        help="update codec of the --codec-methods variants")
    parser.add_argument("--codec-methods", nargs="*", default=["prunefl-unstructured"],
                        choices=list(METHODS))
    parser.add_argument("--density", type=float, default=0.15,
                        help="pruning.initial-density of the unstructured methods")
    parser.add_argument("--max-density", type=float, default=0.2,
                        help="pruning.max-density of the unstructured methods")
    parser.add_argument("--structured-density", type=float, default=0.4,
                        help="pruning.initial-density of prunefl-structured (channels)")
    parser.add_argument("--structured-max-density", type=float, default=0.45,
                        help="pruning.max-density of prunefl-structured")
    parser.add_argument("--interval", type=int, default=3,
                        help="pruning.interval of the prunefl methods")
    parser.add_argument("--report-codec", default="topk:0.05",
                        help="pruning.report-codec: codec of the sites' squared gradients")
    parser.add_argument("--rounds", type=int, default=10)
    add_target_arguments(parser)
    parser.set_defaults(tail=3)  # a Dice of 0.1-0.5 moves by a tenth from round to round
    add_set_arguments(parser)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--resume", action="store_true", help="keep the runs already in --output")
    parser.add_argument("--table", action="store_true",
                        help="print the markdown table of --output and run nothing")
    return parser


def variants(methods: Sequence[str], codec: str, codec_methods: Sequence[str]) -> list[Variant]:
    """Dense first, then every method alone, then the ``codec_methods`` with ``codec``."""
    config = parse_config(codec)
    alone = [Variant(m) for m in dict.fromkeys([DENSE, *methods])]
    return alone + [Variant(m, config) for m in dict.fromkeys(codec_methods)]


def _write(path: Path, meta: dict, rows: list[dict], missing: list[str], tail: int,
           fraction: float) -> list[dict]:
    per_seed = compare_seeds(rows, tail, fraction)
    summary = summarise(per_seed)
    write_report(path, {"meta": meta, "runs": summary, "goals": goals(summary),
                        "per_seed": per_seed, "missing": missing}, indent=1)
    return summary


def _report(row: dict) -> None:
    speed = row["seconds_ratio"]
    print(f"[{row['set']} seed {row['seed']}] {row['variant']:<36} {row['rounds']:3d} rounds "
          f"{row['seconds']:6.1f} s  kept {row['params_kept']:.3f}  final "
          f"{row['final_metric']:.3f} ({row['relative_to_dense']:.3f} of dense)  to target "
          + (f"x{speed:.2f} sooner, x{row['bytes_ratio']:.1f} fewer bytes" if speed
             else "never"), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.table:
        print(markdown_table(json.loads(args.output.read_text())["runs"]))
        return 0
    settings = PruningSettings({"unstructured": (args.density, args.max_density),
                                "structured": (args.structured_density,
                                               args.structured_max_density)},
                               args.interval, args.report_codec)
    wanted = variants(args.methods, args.codec, args.codec_methods)
    for variant in wanted:  # the product refuses a bad setting before any run
        variant.check(settings)
    started = time.perf_counter()
    previous = json.loads(args.output.read_text()) if args.resume and \
        args.output.is_file() else {}
    meta = {"benchmark": "pruning", "description": __doc__.split("\n\n")[0],
            "engine": "in-process", "setup": {k: (str(v) if isinstance(v, Path) else v)
                                              for k, v in vars(args).items()},
            "skipped": {}, "versions": environment(),
            "commands": previous.get("meta", {}).get("commands", []) + [
                list(sys.argv[1:] if argv is None else argv)]}
    rows = list(previous.get("per_seed", []))  # compare_seeds recomputes what it adds
    done = {(r["set"], r["seed"], r["variant"]) for r in rows}
    missing: list[str] = []
    warm: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="pruning-bench-") as tmp:
        workdir = args.workdir or Path(tmp)
        for seed in args.seeds:
            for name in args.sets:
                federation = pruning_set(name, args)
                if federation is None:
                    meta["skipped"][name] = f"{args.shared_data}: {SETS[name].shared_file} " \
                                            "not found"
                    print(f"[{name}] skipped: {meta['skipped'][name]}", flush=True)
                    continue
                for variant in wanted:
                    if (name, seed, variant.name) in done:
                        continue
                    dense = (name, seed, DENSE) in done
                    if (args.budget_seconds is not None and time.perf_counter() - started
                            > args.budget_seconds) or (not dense and variant.method != DENSE):
                        missing.append(f"{name} seed {seed} {variant.name}")
                        continue
                    if name not in warm:  # the process's first federation of the set: untimed
                        pruning_run(federation, Variant(DENSE), settings, seed, 1, workdir)
                        warm.add(name)
                    rows.append(pruning_run(federation, variant, settings, seed, args.rounds,
                                            workdir))
                    done.add((name, seed, variant.name))
                    _report(compare_seeds(rows, args.tail, args.fraction)[-1])
                    _write(args.output, meta, rows, missing, args.tail, args.fraction)
    meta["wall_seconds"] = time.perf_counter() - started
    summary = _write(args.output, meta, rows, missing, args.tail, args.fraction)
    print(f"\n{markdown_table(summary)}\n\nresults in {args.output}"
          + (f" (not run: {'; '.join(missing)})" if missing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
