"""The command line every simulation shares: its counts and ``--output``; the JSON, timed.

A simulation runs from the repository root as a module, e.g. ``.venv/bin/python -m
tests.simulations.fednova_inconsistency``: single-threaded (:mod:`bench.single_thread`,
imported here before numpy), its JSON in ``bench/results/`` unless ``--output`` says
otherwise, then its table printed.
"""

from __future__ import annotations

from bench.single_thread import BENCH  # noqa: I001 - first: one BLAS thread before numpy

import argparse  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

from bench.report import write_report  # noqa: E402


def finite(obj: object) -> object:
    """``obj`` with every non-finite float (a target never reached: ``inf``) as ``None``."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [finite(v) for v in obj]
    return obj


def main(doc: str, name: str, counts: dict[str, tuple[int, str]],
         simulate: Callable[[argparse.Namespace], dict], show: Callable[[dict], None],
         argv: list[str] | None = None) -> int:
    """Parse ``counts`` (``{flag: (default, help)}``, integers) and ``--output``, run
    ``simulate(args)`` and fill its report's ``cpu_s`` with the CPU seconds it took; write
    the report (:func:`finite`) to ``--output`` (``bench/results/NAME.json``) and ``show`` it."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    for flag, (default, text) in counts.items():
        parser.add_argument(flag, type=int, default=default, help=text)
    parser.add_argument("--output", type=Path, default=BENCH / "results" / f"{name}.json",
                        help="JSON output path")
    args = parser.parse_args(argv)
    started = time.process_time()
    report = simulate(args)
    report["cpu_s"] = time.process_time() - started
    write_report(args.output, finite(report), allow_nan=False)
    show(report)
    print(f"cpu {report['cpu_s']:.1f} s; wrote {args.output}")
    return 0
