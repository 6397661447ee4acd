"""Command line of the site data writers: ``python -m clients.datagen COMMAND --task TASK ...``.

Commands
--------
``synthetic --task T --out DIR [--sites N] [--seed S] [--image-size P]``
    Write synthetic hospitals with the task's generator (its ``main``, see
    :data:`clients.registry.TASKS`).
``shared --task T [--set S] --shared DIR --out DIR --sites N ...``
    Convert a shared real set into sites (:func:`clients.datagen.shared.main`).
``vertical --set S [--shared DIR] --out DIR [--seed S] [--coverage C]``
    Write a vertical set's sites (:mod:`clients.datagen.vertical_sets`).
``default-set TASK``
    Print the task's default shared set (used by the Makefile; imports no
    imaging library).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from clients.registry import TASKS, synthetic_module

USAGE = ("usage: python -m clients.datagen synthetic --task TASK --out DIR [--sites N] [--seed S] ...\n"
         "       python -m clients.datagen shared --task TASK [--set SET] --shared DIR --out DIR --sites N ...\n"
         "       python -m clients.datagen vertical --set SET [--shared DIR] --out DIR [--seed S] [--coverage C]\n"
         "       python -m clients.datagen default-set TASK\n"
         f"tasks: {', '.join(TASKS)}")


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to the task's generator or to the shared-set converter; return the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\n" + USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "default-set":
        if len(rest) != 1:
            print(USAGE, file=sys.stderr)
            return 2
        try:
            print(TASKS.get(rest[0]).default_set(rest[0]))
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    if command == "shared":
        from clients.datagen.shared import main as convert_main  # noqa: PLC0415 - imports numpy and imaging

        return convert_main(rest)
    if command == "vertical":
        from clients.datagen.vertical_sets import main as vertical_main  # noqa: PLC0415 - as above

        return vertical_main(rest)
    if command == "synthetic":
        task = None
        if "--task" in rest[:-1]:
            i = rest.index("--task")
            task, rest = rest[i + 1], rest[:i] + rest[i + 2:]
        if task is None:
            print("error: synthetic needs --task TASK\n" + USAGE, file=sys.stderr)
            return 2
        try:
            module = synthetic_module(task)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return module.main(rest)
    print(f"error: unknown command {command!r}\n" + USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
