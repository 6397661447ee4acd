"""The layers of ../shared/DESIGN.md, read from the code's import statements (every one,
function-level imports included).

- models/ imports no Flower and none of app/, clients/, strategies/;
- clients/ imports no Flower and nothing of app/; of strategies/ only the pure modules of
  :data:`CLIENT_SIDE_STRATEGIES` (docs/ARCHITECTURE.md, "What clients/ imports of
  strategies/"), and those modules reach no Flower through their own imports but its
  secure-aggregation primitives (:data:`FLOWER_PRIMITIVES`);
- strategies/ imports no torch, MONAI, app/, clients/ or models/.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The modules of strategies/ the site side may import: pure numpy or stdlib, no Flower.
CLIENT_SIDE_STRATEGIES = frozenset({
    "strategies.errors",                     # the exception root
    "strategies.run_keys",                   # the run config's flat keys: types, defaults, ranges
    "strategies.registry",                   # the one Registry type
    "strategies.seeds",                      # every seed the product derives
    "strategies.message_keys",               # the wire contract's record and metric names
    "strategies.model_buffer",               # the packed model (named tensors, one buffer)
    "strategies.compression",                # encode / decode / ErrorFeedback
    "strategies.update_codec",               # pack_update / unpack_update
    "strategies.codecs.registry",            # CODECS, for the policy's codec names
    "strategies.downlink_header",            # the downlink entries of an instruction
    "strategies.downlink_receive",           # a site's receive of the compressed downlink
    "strategies.downlink_reference",         # the reference model both ends hold
    "strategies.plugins.options",            # PluginError, PluginOptions (personalisation options)
    "strategies.plugins.personalisation.options",  # the personalisation.* section
    "strategies.plugins.personalisation.gain",     # the personalised-gain metric names
    "strategies.local_solver",               # LocalSolver: a site's own a-norm (FedNova, SecAgg+)
    "strategies.secure_aggregation.errors",       # SecAggError
    "strategies.secure_aggregation.settings",     # RoundPlan, in a stage's instruction
    "strategies.secure_aggregation.participant",  # the site's side of the SecAgg+ stages
    "strategies.secure_aggregation.vector",       # the masked vector, rand-k's shared coordinates
    "strategies.secure_aggregation.weights",      # site_coefficient, applied before masking
    "strategies.vertical.options",                # VerticalOptions, the vertical.* section
    "strategies.plugins.pruning.mask",            # the pruning mask: compact / expand, its record
})

#: Flower's pure primitives the listed modules may reach (functions over bytes and numpy
#: arrays, no Flower runtime): Shamir sharing, Fernet, the share plaintext, quantisation.
FLOWER_PRIMITIVES = ("flwr.common.secure_aggregation",)

FORBIDDEN = {
    "models": ("flwr", "app", "clients", "strategies"),
    "clients": ("flwr", "app"),
    "strategies": ("torch", "monai", "app", "clients", "models"),
}


def module_name(path: Path) -> str:
    """Return the dotted name of a source file of the repository."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    """Whether a dotted name is a module or package of the repository."""
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(path: Path) -> set[str]:
    """Return every module a file imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]
                            if node.level else [node.module or ""]).strip(".")
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names
                         if is_module(f"{base}.{alias.name}"))
    return found


def sources(layer: str) -> list[Path]:
    """Return the .py files of a top-level folder."""
    return sorted(p for p in (ROOT / layer).rglob("*.py") if "__pycache__" not in p.parts)


def within(name: str, top: str) -> bool:
    """Whether ``name`` is the package ``top`` or inside it."""
    return name == top or name.startswith(top + ".")


def test_each_layer_imports_only_what_it_may():
    broken = [f"{path.relative_to(ROOT)} imports {name}"
              for layer, tops in FORBIDDEN.items() for path in sources(layer)
              for name in sorted(imports_of(path)) if any(within(name, top) for top in tops)]
    assert not broken, "layering of ../shared/DESIGN.md broken:\n" + "\n".join(broken)


def test_clients_import_only_the_listed_pure_modules_of_strategies():
    imported = {name: path for path in sources("clients") for name in imports_of(path)
                if within(name, "strategies")}
    unlisted = [f"{path.relative_to(ROOT)} imports {name}" for name, path in sorted(imported.items())
                if name not in CLIENT_SIDE_STRATEGIES and not any(
                    within(allowed, name) for allowed in CLIENT_SIDE_STRATEGIES)]
    assert not unlisted, ("clients/ may import of strategies/ only CLIENT_SIDE_STRATEGIES "
                          "(tests/test_layering.py, docs/ARCHITECTURE.md):\n" + "\n".join(unlisted))


def test_the_listed_modules_reach_no_flower_through_their_imports():
    path_of = {module_name(p): p for p in sources("strategies")}
    reached: dict[str, str] = {}
    todo = [(name, name) for name in CLIENT_SIDE_STRATEGIES]
    flower = []
    while todo:
        name, via = todo.pop()
        if name in reached or name not in path_of:
            continue
        reached[name] = via
        parents = [name.rsplit(".", k)[0] for k in range(1, name.count(".") + 1)]
        todo.extend((parent, via) for parent in parents)  # importing runs each parent's __init__
        for imported in imports_of(path_of[name]):
            if within(imported, "flwr") and not any(
                    within(imported, allowed) for allowed in FLOWER_PRIMITIVES):
                flower.append(f"{name} (reached from {via}) imports {imported}")
            todo.append((imported, via))
    assert not flower, "\n".join(sorted(flower))


def test_the_architecture_page_lists_the_modules_clients_may_import():
    page = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    heading = "### What clients/ imports of strategies/"
    assert heading in page, f"docs/ARCHITECTURE.md has no section {heading!r}"
    section = page.split(heading, 1)[1].split("\n## ", 1)[0]
    unlisted = sorted(name for name in CLIENT_SIDE_STRATEGIES if f"`{name}`" not in section)
    assert not unlisted, ("docs/ARCHITECTURE.md, 'What clients/ imports of strategies/' "
                          f"does not name: {', '.join(unlisted)}")
