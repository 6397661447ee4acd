"""The command line of a synthetic hospital generator: ``python -m clients.datagen synthetic --task <task>``.

Each task's generator module declares its command as a :class:`GeneratorCommand`
(``main = GeneratorCommand(...)``): ``--out/--sites/--seed/--image-size``, one
progress line per hospital and a summary line, the same for every task.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clients.datagen.federation import SyntheticFederation

__all__ = ["GeneratorCommand"]


@dataclass(frozen=True)
class GeneratorCommand:
    """A task generator's command line; call it with the arguments after ``--task <task>``."""

    task: str  # the task's registry name, shown in the usage line
    generate: SyntheticFederation[Any]  # the task's generate_federation
    description: str  # the usage text's description
    image_size_help: str  # --image-size's help (its default is generate.image_size)
    min_image_size: int  # the smallest --image-size accepted
    # (profile, site_dir, elapsed_s) -> (progress text, counts to total, e.g. {"studies": 8})
    describe: Callable[[Any, Path, float], tuple[str, Mapping[str, int]]]

    def parse(self, argv: Sequence[str] | None) -> argparse.Namespace:
        """Parse ``--out/--sites/--seed/--image-size`` (exits with a usage error on bad values)."""
        parser = argparse.ArgumentParser(prog=f"python -m clients.datagen synthetic --task {self.task}",
                                         description=self.description)
        parser.add_argument("--out", type=Path, required=True,
                            help="output folder (one sub-folder per hospital)")
        parser.add_argument("--sites", type=int, default=3, help="number of hospitals (default 3)")
        parser.add_argument("--seed", type=int, default=0, help="federation seed (default 0)")
        parser.add_argument("--image-size", type=int, default=self.generate.image_size,
                            help=self.image_size_help)
        args = parser.parse_args(argv)
        if args.sites < 1:
            parser.error("--sites must be >= 1")
        if args.image_size is not None and args.image_size < self.min_image_size:
            parser.error(f"--image-size must be >= {self.min_image_size}")
        return args

    def __call__(self, argv: Sequence[str] | None = None) -> int:
        """Write a federation from the command line, printing progress; return the exit status.

        After each hospital: ``[i/n] <name>: <text> -> <site_dir>`` with ``text, counts =
        describe(profile, site_dir, elapsed_s)`` (the counts are totalled); last: ``Done:
        <n> hospitals, <total> <count name>, ... (<size>x<size>) in <t> s under <out>``
        (the size when one was given or is the default). A site that cannot be written
        (``FileExistsError``, ``OSError``) prints ``error: ...`` to stderr and gives 1.
        """
        args = self.parse(argv)
        start = time.perf_counter()
        totals: Counter[str] = Counter()

        def report(i: int, profile: Any, site_dir: Path) -> None:
            text, counts = self.describe(profile, site_dir, time.perf_counter() - start)
            totals.update(counts)
            print(f"[{i + 1}/{args.sites}] {profile.name}: {text} -> {site_dir}", flush=True)

        try:
            self.generate(args.out.resolve(), args.sites, args.seed, args.image_size, on_site=report)
        except (FileExistsError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        elapsed = time.perf_counter() - start
        counted = ", ".join(f"{total} {name}" for name, total in totals.items())
        size = "" if args.image_size is None else f" ({args.image_size}x{args.image_size})"
        print(f"Done: {args.sites} hospitals, {counted}{size} in {elapsed:.1f} s under {args.out}")
        return 0
