"""The build backend of the ``fedmed`` wheel: the product under one namespace, ``fedmed.*``.

In the repository the product's packages are top-level folders (``app/``, ``strategies/``,
``clients/``, ``models/``: the product card fixes them) and import each other by those
names. In a hospital's site-packages four such names would collide with anything else
called ``app`` or ``models``. So the wheel holds them under ``fedmed.``, the way pip
vendors its own dependencies (``pip._vendor``, with their imports rewritten):

* ``fedmed/app``, ``fedmed/strategies``, ``fedmed/clients``, ``fedmed/models``: the
  packages, every absolute import of a product package (``from app.x import y``,
  ``import app.x as z``) and every string that names a product module
  (``"clients.pe_seg.task:PESegTask"``, ``-m app.site_runtime.site_node``, a registry's
  package) rewritten to ``fedmed.<package>...``: the hospital's runtime and tools;
* ``fedmed/bundle``: the Flower app project, unchanged (``pyproject.toml``, ``configs/``
  and the four packages as they are in the repository): what ``fedmed federate`` bundles
  and submits, ``fedmed sign-app`` signs, and a site's sandboxed worker runs
  (:mod:`app.config.product_paths`). The bundle's own ``app`` package is imported from
  the installed bundle folder, never from site-packages, so the runtime's copy and the
  bundle's never meet.

The console command ``fedmed`` is :func:`app.tooling.cli.main`. Editable installs and
sdists are setuptools' own (the checkout's layout, ``make install``); only
:func:`build_wheel` stages the namespace::

    pip wheel --no-deps --no-build-isolation -w wheelhouse .

This module imports only the standard library, setuptools and the product's error root
(stdlib only): it runs in pip's build environment, where nothing else is installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

from setuptools import build_meta as _setuptools

if __name__ == "wheel_build":  # pip's build environment: the checkout is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from strategies.wire.errors import ConfigError  # noqa: E402

__all__ = ["NAMESPACE", "PACKAGES", "build_wheel", "build_editable", "build_sdist",
           "rewrite_imports", "stage_wheel_project"]

#: The one importable name the wheel installs.
NAMESPACE = "fedmed"
#: The product's top-level packages in the repository.
PACKAGES = ("app", "strategies", "clients", "models")
#: The Flower app project's folder inside the wheel.
BUNDLE = "bundle"

_TOP = "|".join(PACKAGES)
_FROM = re.compile(rf"^(\s*from\s+)({_TOP})(?=[\s.])", re.M)
_IMPORT_AS = re.compile(rf"^(\s*import\s+)({_TOP})(?=\.[\w.]+\s+as\s)", re.M)
_BARE_IMPORT = re.compile(rf"^\s*import\s+({_TOP})\b", re.M)
_MODULE_STRING = re.compile(rf"(?<=[\"'])({_TOP})(?=\.[A-Za-z_][\w.]*(?::[\w.]+)?[\"'])")

# PEP 517 hooks that keep setuptools' behaviour (the checkout's layout).
get_requires_for_build_wheel = _setuptools.get_requires_for_build_wheel
get_requires_for_build_editable = _setuptools.get_requires_for_build_editable
prepare_metadata_for_build_editable = _setuptools.prepare_metadata_for_build_editable
build_editable = _setuptools.build_editable
get_requires_for_build_sdist = _setuptools.get_requires_for_build_sdist
build_sdist = _setuptools.build_sdist


class WheelLayoutError(ConfigError):
    """The checkout cannot be staged as the ``fedmed.*`` wheel (names the file)."""


def rewrite_imports(source: str, path: str = "<source>") -> str:
    """``source`` with every reference to a product package moved under ``fedmed.``.

    >>> rewrite_imports('from app.config import x\\nREG = "clients.registry:TASKS"\\n')
    'from fedmed.app.config import x\\nREG = "fedmed.clients.registry:TASKS"\\n'

    Raises
    ------
    WheelLayoutError
        For a bare ``import app.x`` (it binds ``app``, which the wheel does not have).
    """
    text = _IMPORT_AS.sub(rf"\1{NAMESPACE}.\2", _FROM.sub(rf"\1{NAMESPACE}.\2", source))
    bare = [m for m in _BARE_IMPORT.finditer(text)]
    if bare:
        line = text.count("\n", 0, bare[0].start()) + 1
        raise WheelLayoutError(f"{path}:{line}: `import {bare[0].group(1)}...` binds a top-level "
                               f"name; write `from {bare[0].group(1)}... import ...` instead")
    return _MODULE_STRING.sub(rf"{NAMESPACE}.\1", text)


def _package_files(root: Path, package: str) -> list[Path]:
    """The package's files (no byte code), relative to ``root``."""
    return sorted(p.relative_to(root) for p in (root / package).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def _wheel_pyproject(project: dict) -> str:
    """The staged project's ``pyproject.toml``: the repository's metadata, the namespace."""
    meta = project["project"]
    extras = "".join(f"{json.dumps(name)} = {_toml_list(deps)}\n"
                     for name, deps in meta.get("optional-dependencies", {}).items())
    return (
        "[build-system]\nrequires = [\"setuptools>=77\", \"wheel\"]\n"
        "build-backend = \"setuptools.build_meta\"\n\n"
        f"[project]\nname = {json.dumps(meta['name'])}\nversion = {json.dumps(meta['version'])}\n"
        f"description = {json.dumps(meta['description'])}\nreadme = \"README.md\"\n"
        f"requires-python = {json.dumps(meta['requires-python'])}\n"
        f"license = {json.dumps(meta['license'])}\n"
        f"dependencies = {_toml_list(meta['dependencies'])}\n\n"
        f"[project.optional-dependencies]\n{extras}\n"
        f"[project.scripts]\nfedmed = \"{NAMESPACE}.app.tooling.cli:main\"\n\n"
        f"[tool.setuptools.packages.find]\ninclude = [\"{NAMESPACE}\", \"{NAMESPACE}.*\"]\n\n"
        f"[tool.setuptools.package-data]\n\"*\" = [\"*.html\", \"*.css\"]\n"
        f"{NAMESPACE} = [\"{BUNDLE}/**/*\"]\n")


def stage_wheel_project(root: Path, stage: Path) -> Path:
    """Write the ``fedmed.*`` project of the checkout ``root`` into ``stage``; returns it.

    Raises
    ------
    WheelLayoutError
        ``root`` is no checkout of the product, or a module cannot be rewritten.
    """
    pyproject = root / "pyproject.toml"
    if not all((root / p).is_dir() for p in PACKAGES) or not pyproject.is_file():
        raise WheelLayoutError(f"{root}: not a checkout of the product (pyproject.toml and "
                               f"{', '.join(PACKAGES)} expected)")
    project = tomllib.loads(pyproject.read_text())
    package_dir = stage / NAMESPACE
    bundle = package_dir / BUNDLE
    for package in PACKAGES:
        for relative in _package_files(root, package):
            source, target = root / relative, package_dir / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            if relative.suffix == ".py":
                target.write_text(rewrite_imports(source.read_text(), str(relative)))
            else:
                shutil.copy2(source, target)
            (bundle / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, bundle / relative)
    shutil.copytree(root / "configs", bundle / "configs",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(pyproject, bundle / "pyproject.toml")
    (package_dir / "__init__.py").write_text(
        f'"""fedmed {project["project"]["version"]}: federated learning for medical imaging on '
        f'Flower.\n\nThe hospital runtime and tools: fedmed.app, fedmed.strategies, '
        f'fedmed.clients, fedmed.models;\nthe Flower app project: fedmed/bundle (the `fedmed` '
        f'command, fedmed.app.tooling.cli).\n"""\n\n'
        f'__version__ = {json.dumps(project["project"]["version"])}\n')
    shutil.copy2(root / "README.md", stage / "README.md")
    (stage / "pyproject.toml").write_text(_wheel_pyproject(project))
    return stage


def build_wheel(wheel_directory: str, config_settings: dict | None = None,
                metadata_directory: str | None = None) -> str:
    """PEP 517: build the ``fedmed.*`` wheel of the checkout in the current directory."""
    out = os.path.abspath(wheel_directory)
    root = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="fedmed-wheel-") as tmp:
        stage = stage_wheel_project(root, Path(tmp) / "project")
        os.chdir(stage)
        try:
            return _setuptools.build_wheel(out, config_settings)
        finally:
            os.chdir(root)
