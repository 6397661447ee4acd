"""The wheel's namespace (``fedmed.*``) and the ``fedmed`` command's dispatch (#47 item 1)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from app.tooling import cli
from app.tooling.wheel_build import (NAMESPACE, PACKAGES, WheelLayoutError, rewrite_imports,
                                     stage_wheel_project)

ROOT = Path(__file__).resolve().parents[2]


def test_imports_and_module_strings_move_under_the_namespace():
    source = ("from app.config import run_config\n"
              "from strategies import rounds\n"
              "    from clients.pe_seg.task import PESegTask  # indented, lazy\n"
              "import models.unet25d as unet\n"
              "TASK = \"clients.pe_seg.task:PESegTask\"\n"
              "ARGS = ['-m', 'app.site_runtime.site_node']\n"
              "from apparatus import x\n"
              "NAME = 'app'\n")
    out = rewrite_imports(source)
    assert "from fedmed.app.config import run_config" in out
    assert "from fedmed.strategies import rounds" in out
    assert "    from fedmed.clients.pe_seg.task import PESegTask" in out
    assert "import fedmed.models.unet25d as unet" in out
    assert '"fedmed.clients.pe_seg.task:PESegTask"' in out
    assert "'fedmed.app.site_runtime.site_node'" in out
    assert "from apparatus import x" in out and "NAME = 'app'" in out


def test_a_bare_import_of_a_product_package_is_refused_with_its_line():
    with pytest.raises(WheelLayoutError, match=r"x\.py:2: `import app"):
        rewrite_imports("import os\nimport app.config\n", "x.py")


def test_every_staged_module_parses_and_names_no_top_level_product_package(tmp_path):
    stage = stage_wheel_project(ROOT, tmp_path / "stage")
    package = stage / NAMESPACE
    for path in package.rglob("*.py"):
        if (package / "bundle") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert node.module.split(".")[0] not in PACKAGES, f"{path}: from {node.module}"
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert alias.name.split(".")[0] not in PACKAGES, f"{path}: {alias.name}"
    bundle = package / "bundle"
    assert (bundle / "pyproject.toml").read_text() == (ROOT / "pyproject.toml").read_text()
    assert (bundle / "app" / "server_app.py").read_text() == (ROOT / "app/server_app.py").read_text()
    assert 'fedmed = "fedmed.app.tooling.cli:main"' in (stage / "pyproject.toml").read_text()


def test_staging_refuses_a_folder_that_is_not_the_checkout(tmp_path):
    with pytest.raises(WheelLayoutError, match="not a checkout of the product"):
        stage_wheel_project(tmp_path, tmp_path / "stage")


def test_each_command_names_an_entry_point_that_exists():
    for words, (spec, _) in cli.COMMANDS.items():
        assert callable(cli._entry(spec)), words


def test_an_unknown_command_is_refused_with_the_near_ones(capsys):
    assert cli.main(["app", "approve-all"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'app approve-all'" in err and "fedmed app approve" in err
    assert cli.main([]) == 2 and cli.main(["--help"]) == 0


def test_site_start_without_a_site_folder_says_how_to_make_one(tmp_path, capsys):
    assert cli.main(["site", "start", "--home", str(tmp_path / "nowhere")]) == 2
    assert "fedmed site init" in capsys.readouterr().err
