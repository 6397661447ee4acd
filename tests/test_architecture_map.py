"""docs/ARCHITECTURE.md's module map names every module of the code, and only modules that exist.

The map is the code block under "Layers and allowed imports". Its format:

- a line opens a folder when it starts (after its indent) with one or more ``name/``
  tokens (``pe_seg/ cxr_cls/ ct3d_cls/`` opens three folders that share the names below);
- a line belongs to the innermost folder opened on a line with a smaller indent;
  a folder line's own text belongs to the folder(s) it opens;
- every ``name.py`` or ``sub/name.py`` token on a line names a module relative to that
  folder; a path starting with a top-level folder (``strategies/wire/seeds.py``) is from the root.

Every ``.py`` file of app/, strategies/, clients/ and models/ but ``__init__.py`` must
be named under its own folder, and every named module must exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAP_DOC = ROOT / "docs" / "ARCHITECTURE.md"
LAYERS = ("app", "strategies", "clients", "models")
FOLDER = re.compile(r"\w+/")
MODULE = re.compile(r"(?<![\w/.-])((?:\w+/)*\w+\.py)\b")


def map_block(text: str) -> tuple[int, list[str]]:
    """Return the code block under "Layers and allowed imports": its first line's number, its lines."""
    lines = text.splitlines()
    heading = lines.index("## Layers and allowed imports")
    start = next(i for i in range(heading, len(lines)) if lines[i].startswith("```")) + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("```"))
    return start + 1, lines[start:end]


def leading_folders(line: str) -> list[str]:
    """Return the ``name/`` tokens a line starts with (the folders it opens)."""
    folders = []
    for token in line.split():
        if not FOLDER.fullmatch(token):
            break
        folders.append(token.rstrip("/"))
    return folders


def named_modules(lines: list[str], first_line: int = 1) -> dict[str, int]:
    """Return each module path the map names (relative to the root) -> the line naming it first."""
    named: dict[str, int] = {}
    stack: list[tuple[int, list[str]]] = [(-1, [""])]
    for number, line in enumerate(lines, start=first_line):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        while stack[-1][0] >= indent:
            stack.pop()
        folders = stack[-1][1]
        opened = leading_folders(line)
        if opened:
            folders = [f"{parent}{name}/" for parent in folders for name in opened]
            stack.append((indent, folders))
        for path in MODULE.findall(line):
            bases = [""] if path.split("/", 1)[0] in LAYERS else folders
            for base in bases:
                named.setdefault(base + path, number)
    return named


def code_modules() -> set[str]:
    """Return every .py module of the four layers but __init__.py, relative to the root."""
    return {path.relative_to(ROOT).as_posix()
            for layer in LAYERS for path in (ROOT / layer).rglob("*.py")
            if path.name != "__init__.py" and "__pycache__" not in path.parts}


def test_the_parser_reads_folders_shared_names_and_root_paths():
    block = ["app/         glue",
             "  tracking/          tracker.py FederationTracker; outbox.py",
             "                     traffic_text.py words",
             "  predict.py         uses tracking/figures.py and strategies/wire/seeds.py",
             "clients/     site side",
             "  pe_seg/ cxr_cls/   one package per task",
             "    task.py data.py  the task",
             "  registry.py        TASKS"]
    assert set(named_modules(block)) == {
        "app/tracking/tracker.py", "app/tracking/outbox.py", "app/tracking/traffic_text.py",
        "app/predict.py", "app/tracking/figures.py", "strategies/wire/seeds.py",
        "clients/pe_seg/task.py", "clients/pe_seg/data.py", "clients/cxr_cls/task.py",
        "clients/cxr_cls/data.py", "clients/registry.py"}


def test_the_module_map_names_exactly_the_modules_of_the_code():
    first_line, lines = map_block(MAP_DOC.read_text(encoding="utf-8"))
    named = named_modules(lines, first_line)
    missing = sorted(code_modules() - set(named))
    stale = sorted(f"{path} (line {line})" for path, line in named.items()
                   if not (ROOT / path).is_file())
    problems = ([f"not in the module map: {path}" for path in missing]
                + [f"named in the module map, no such file: {path}" for path in stale])
    if problems:
        pytest.fail("docs/ARCHITECTURE.md, 'Layers and allowed imports':\n" + "\n".join(problems),
                    pytrace=False)
