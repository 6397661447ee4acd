"""Every private Flower internal the product reaches is listed in docs/ARCHITECTURE.md, and exists.

The section "Flower internals the product reaches" of docs/ARCHITECTURE.md has one
table row per internal (a dotted name in backticks in its second column). These
tests read the product's code (app/, strategies/, clients/, models/, bench/) for
the Flower names it imports, the attributes it reads or replaces on a Flower
module, and the private attributes it writes on Flower objects, and check that

* the table lists exactly those internals (none missing, none left over);
* each one still exists in the installed Flower, so an upgrade that removes or
  renames one fails here, by name, and not in a running federation;
* each module global the product replaces (a row whose purpose starts with
  "patched") is still looked up by its module at call time, else the patch
  would silently do nothing.

Public Flower API: the packages of Flower's API reference (:data:`PUBLIC_MODULES`)
and the names they export; everything else under ``flwr.`` is an internal.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
SECTION = "## Flower internals the product reaches"
#: The product's code (tests may reach more internals to fake Flower's servers).
SCANNED = ("app", "strategies", "clients", "models", "bench")
#: Flower's public packages: a name imported from one of these is public API.
PUBLIC_MODULES = frozenset({"flwr", "flwr.app", "flwr.clientapp", "flwr.serverapp",
                            "flwr.serverapp.strategy", "flwr.common", "flwr.simulation",
                            "flwr.client", "flwr.server"})
#: A private field of a public object, written through ``.metadata.__dict__["_field"]``.
METADATA = "flwr.app.Metadata"


def _is_module(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def _flower_names(tree: ast.Module) -> tuple[dict[str, str], dict[str, str]]:
    """``(modules, objects)``: local name -> Flower module / ``module.name`` it was bound to."""
    modules: dict[str, str] = {}
    objects: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "flwr":
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                (modules if _is_module(full) else objects)[alias.asname or alias.name] = full
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("flwr.") and alias.asname:
                    modules[alias.asname] = alias.name
    return modules, objects


def internals_of(source: str) -> set[str]:
    """The private Flower names one module of ours imports, reads, replaces or writes."""
    tree = ast.parse(source)
    modules, objects = _flower_names(tree)
    found = {full for full in objects.values() if full.rsplit(".", 1)[0] not in PUBLIC_MODULES}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            name = node.value.id
            if modules.get(name, "flwr") not in PUBLIC_MODULES:
                found.add(f"{modules[name]}.{node.attr}")
            elif name in objects and node.attr.startswith("_") and not node.attr.endswith("__"):
                found.add(f"{objects[name]}.{node.attr}")
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "__dict__" and isinstance(node.value.value, ast.Attribute) \
                and node.value.value.attr == "metadata" and isinstance(node.slice, ast.Constant):
            found.add(f"{METADATA}.{node.slice.value}")
    return found


def code_internals() -> dict[str, set[str]]:
    """Internal -> the files of ours that reach it."""
    found: dict[str, set[str]] = {}
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            for name in internals_of(path.read_text(encoding="utf-8")):
                found.setdefault(name, set()).add(path.relative_to(ROOT).as_posix())
    return found


def documented_rows() -> dict[str, str]:
    """Internal -> its row's purpose column, from the doc section's table."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0] if SECTION in text else ""
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 5 or not cells[1].startswith("`flwr."):
            continue
        name = cells[1].strip("`")
        assert name not in rows, f"{DOC.name}: {name} has two rows"
        rows[name] = cells[3]
    return rows


def test_the_doc_lists_exactly_the_internals_the_code_reaches():
    in_code = code_internals()
    in_doc = documented_rows()
    missing = {name: sorted(files) for name, files in in_code.items() if name not in in_doc}
    assert not missing, f"{DOC.name} ({SECTION}) lacks a row for: {missing}"
    stale = sorted(set(in_doc) - set(in_code))
    assert not stale, f"{DOC.name} ({SECTION}) lists internals no code of ours reaches: {stale}"


def _metadata_field_works(field: str) -> None:
    """A ``Metadata`` field written through ``__dict__`` is what its public property reads."""
    from flwr.app import Metadata  # noqa: PLC0415

    metadata = Metadata(run_id=1, message_id="m", src_node_id=2, dst_node_id=3,
                        reply_to_message_id="", group_id="", created_at=0.0, ttl=1.0,
                        message_type="train")
    assert field in vars(metadata), f"{METADATA} no longer keeps {field}"
    public = field.lstrip("_")
    before = getattr(metadata, public)
    metadata.__dict__[field] = type(before)(7) if isinstance(before, int) else "written"
    assert getattr(metadata, public) == metadata.__dict__[field]


def _resolve(name: str) -> object:
    """The object ``name`` (a module plus attributes) names in the installed Flower."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if _is_module(module):
            obj: object = importlib.import_module(module)
            for attribute in parts[cut:]:
                assert hasattr(obj, attribute), f"{module} has no {'.'.join(parts[cut:])}"
                obj = getattr(obj, attribute)
            return obj
    raise AssertionError(f"no module of {name} imports")


@pytest.mark.parametrize("name", sorted(documented_rows()))
def test_each_listed_internal_exists_in_the_installed_flower(name):
    if name.startswith(f"{METADATA}."):
        _metadata_field_works(name.rsplit(".", 1)[1])
    else:
        _resolve(name)


@pytest.mark.parametrize("name", sorted(n for n, purpose in documented_rows().items()
                                        if purpose.lower().startswith("patched")))
def test_each_patched_global_is_still_looked_up_by_its_module(name):
    module_name, attribute = name.rsplit(".", 1)
    source = inspect.getsource(importlib.import_module(module_name))
    assert re.search(rf"(?<![\w.]){re.escape(attribute)}\s*[(.]", source), (
        f"{module_name} no longer calls {attribute}: replacing it would change nothing")


def test_the_scan_sees_imports_patches_and_private_fields():
    source = (
        "import flwr.supernode.start_client_internal as loop\n"
        "from flwr.app import Message\n"
        "from flwr.supercore.task_identity import TaskIdentity\n"
        "from flwr.supercore.inflatable import inflatable_utils\n"
        "loop.pull_objects = None\n"
        "inflatable_utils.get_num_workers = None\n"
        "TaskIdentity._run_id = 1\n"
        "def f(message: Message):\n"
        "    message.metadata.__dict__['_message_id'] = 'x'\n")
    assert internals_of(source) == {
        "flwr.supernode.start_client_internal.pull_objects",
        "flwr.supercore.inflatable.inflatable_utils.get_num_workers",
        "flwr.supercore.task_identity.TaskIdentity",
        "flwr.supercore.task_identity.TaskIdentity._run_id",
        f"{METADATA}._message_id"}
