"""The vertical data sets and their writers: ``python -m clients.datagen vertical --set S ...``.

A vertical set is one group of patients whose variables are split over several
sites (departments or institutions), each folder with its own task and a
``vertical-site.toml``. :data:`VERTICAL_SETS` maps a set's name to its writer,
``"module:function"`` imported on use; a writer is called with the keywords
``shared`` (the shared data folder), ``out``, ``seed`` and, when given,
``coverage``, and returns the folders it wrote. Standard library only until a
writer is imported.

Usage::

    python -m clients.datagen vertical --set heart-disease --shared ../shared/data \\
        --out data/vertical-heart-disease-seed0 --seed 0 [--coverage 0.9]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from strategies.wire.registry import import_path

__all__ = ["SITE_FILE", "VERTICAL_SETS", "main", "write_site_file"]

#: A vertical site folder's statement of its task and department
#: (read by :func:`clients.vertical.stages.vertical_site`).
SITE_FILE = "vertical-site.toml"

#: Set name -> its writer, ``"module:function"``; one line per set.
VERTICAL_SETS: dict[str, str] = {
    "heart-disease": "clients.tabular.departments:write_departments",
    "cohort": "clients.datagen.cohort:write_cohort",
}


def write_site_file(site_dir: Path, task: str, department: str) -> None:
    """Write ``site_dir``'s :data:`SITE_FILE`: the site's task and department."""
    (Path(site_dir) / SITE_FILE).write_text(f'task = "{task}"\ndepartment = "{department}"\n',
                                            encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    """Write the vertical set's folders; print one line per folder; return the exit status
    (2 and ``error: ...`` on stderr when the set cannot be written)."""
    parser = argparse.ArgumentParser(prog="python -m clients.datagen vertical",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", dest="name", required=True, choices=sorted(VERTICAL_SETS))
    parser.add_argument("--shared", type=Path, default=Path("../shared/data"),
                        help="the shared data folder (default ../shared/data)")
    parser.add_argument("--out", type=Path, required=True, help="folder that receives the sites")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--coverage", type=float, default=None,
                        help="share of the patients each site keeps, in (0, 1] (default: the set's)")
    args = parser.parse_args(argv)
    extra = {} if args.coverage is None else {"coverage": args.coverage}
    writer = import_path(VERTICAL_SETS[args.name])
    try:
        folders = writer(shared=args.shared, out=args.out, seed=args.seed, **extra)
    except (FileNotFoundError, FileExistsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for folder in folders:
        print(f"wrote {folder}")
    print(f"Wrote {len(folders)} sites of set {args.name} (seed {args.seed}) to {args.out}")
    return 0
