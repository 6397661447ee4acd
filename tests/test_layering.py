"""The layers of ../shared/DESIGN.md, read from the code's import statements (every one,
function-level imports included).

- models/ imports no Flower and none of app/, clients/, strategies/;
- clients/ imports no Flower and nothing of app/; of strategies/ only the wire kernel,
  :data:`WIRE` and its submodules (docs/ARCHITECTURE.md, "The wire kernel");
- the wire kernel is closed: of strategies/ it imports only itself, and of Flower only
  its secure-aggregation primitives (:data:`FLOWER_PRIMITIVES`);
- strategies/ imports no torch, MONAI, app/, clients/ or models/.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The wire kernel: the one package of strategies/ the site side may import (with its
#: submodules), and which imports nothing of strategies/ outside itself.
WIRE = "strategies.wire"

#: Flower's pure primitives the wire kernel may import (functions over bytes and numpy
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


def outside_the_kernel(imported: dict[str, Path]) -> list[str]:
    """The imports of strategies/ (``name -> importing file``) that are not the wire kernel."""
    return [f"{path.relative_to(ROOT)} imports {name}" for name, path in sorted(imported.items())
            if within(name, "strategies") and not within(name, WIRE)]


def kernel_breaches(imported: dict[str, Path]) -> list[str]:
    """The imports of wire modules (``name -> importing file``) that leave the kernel.

    Outside strategies.wire: any other module of strategies/, any of app/, clients/ or
    models/, and any of Flower but its secure-aggregation primitives.
    """
    return [f"{path.relative_to(ROOT)} imports {name}" for name, path in sorted(imported.items())
            if (within(name, "strategies") and not within(name, WIRE))
            or any(within(name, top) for top in ("app", "clients", "models"))
            or (within(name, "flwr") and not any(within(name, allowed)
                                                  for allowed in FLOWER_PRIMITIVES))]


def test_clients_import_only_the_wire_kernel_of_strategies():
    imported = {name: path for path in sources("clients") for name in imports_of(path)}
    unlisted = outside_the_kernel(imported)
    assert not unlisted, ("clients/ may import of strategies/ only the wire kernel, "
                          f"{WIRE} (tests/test_layering.py, docs/ARCHITECTURE.md):\n"
                          + "\n".join(unlisted))


def test_the_wire_kernel_imports_only_itself():
    wire = ROOT.joinpath(*WIRE.split("."))
    assert (wire / "__init__.py").is_file(), f"no package {WIRE}"
    files = sorted(p for p in wire.rglob("*.py") if "__pycache__" not in p.parts)
    files.append(ROOT / "strategies" / "__init__.py")  # importing the kernel runs it too
    imported = {name: path for path in files for name in imports_of(path)}
    breaches = kernel_breaches(imported)
    assert not breaches, (f"{WIRE} may import of the product only {WIRE}, and of Flower only "
                          f"{', '.join(FLOWER_PRIMITIVES)}:\n" + "\n".join(breaches))


def test_the_rules_catch_a_violation():
    site, kernel = ROOT / "clients" / "x.py", ROOT / "strategies" / "wire" / "x.py"
    assert outside_the_kernel({"strategies.aggregation": site, "strategies": site})
    assert outside_the_kernel({"strategies.wirex": site})
    assert not outside_the_kernel({"strategies.wire.codecs.topk": site, WIRE: site,
                                   "numpy": site})
    assert kernel_breaches({"strategies.rounds.round_loop": kernel})
    assert kernel_breaches({"flwr.app": kernel})
    assert kernel_breaches({"clients.registry": kernel})
    assert not kernel_breaches({"strategies.wire.errors": kernel, "numpy": kernel,
                                "flwr.common.secure_aggregation.quantization": kernel})


def test_the_architecture_page_shows_the_wire_kernel():
    page = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    heading = "### The wire kernel"
    assert heading in page, f"docs/ARCHITECTURE.md has no section {heading!r}"
    section = page.split(heading, 1)[1].split("\n## ", 1)[0]
    wire = ROOT.joinpath(*WIRE.split("."))
    modules = sorted(module_name(p) for p in wire.rglob("*.py")
                     if "__pycache__" not in p.parts and p.name != "__init__.py")
    modules = sorted({name if name.count(".") == 2 else name.rsplit(".", 1)[0]
                      for name in modules})  # a subpackage is named once, as a package
    unlisted = [name for name in modules if f"`{name}`" not in section]
    assert not unlisted, ("docs/ARCHITECTURE.md, 'The wire kernel' does not name: "
                          + ", ".join(unlisted))
