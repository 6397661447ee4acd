"""A tiny Flower app project for the tests of app bundles (approval, the site worker)."""

from __future__ import annotations

import textwrap
from pathlib import Path

PYPROJECT = '''
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "tinyapp"
version = "1.0.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedmed"

[tool.flwr.app.components]
serverapp = "tinyapp_client:app"
clientapp = "tinyapp_client:app"

[tool.flwr.app.config]
task = "tiny"
'''


def write_tiny_app(folder: Path, client_source: str) -> Path:
    """The project ``folder`` (created) with ``tinyapp_client.py`` holding ``client_source``."""
    folder.mkdir(parents=True)
    (folder / "pyproject.toml").write_text(PYPROJECT)
    (folder / "tinyapp_client.py").write_text(textwrap.dedent(client_source))
    return folder
