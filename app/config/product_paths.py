"""Where the product's own files are: the app project Flower bundles, and the working folder.

The product runs from two layouts:

* a **checkout** (``make``): the repository root holds ``pyproject.toml`` (the Flower
  app's ``[tool.flwr.app]``), ``app/``, ``strategies/``, ``clients/``, ``models/`` and
  ``configs/``; deployment folders, Flower homes, data and runs are written beside them;
* an **installed wheel** (``pip install fedmed``; :mod:`app.tooling.wheel_build`): the
  hospital's runtime is the ``fedmed.*`` packages, and the app project that ``fedmed
  federate`` bundles and ``fedmed sign-app`` signs is ``fedmed/bundle/`` (the same
  ``pyproject.toml``, the four packages as they are in the repository, ``configs/``).
  Nothing is written into site-packages: the working folder is the current directory.

Example::

    >>> (PROJECT_ROOT / "pyproject.toml").is_file()
    True
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["INSTALLED", "PROJECT_ROOT", "work_root"]

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
#: The wheel's copy of the Flower app project (absent in a checkout and in a bundle).
_BUNDLE = _PACKAGE_ROOT / "bundle"
#: Whether this code runs from an installed wheel (``fedmed.app...``).
INSTALLED = (_BUNDLE / "pyproject.toml").is_file()
#: The Flower app project: ``flwr run`` bundles it, its ``configs/`` hold the shipped
#: policies and presets, its ``pyproject.toml`` the run-config defaults and the version.
PROJECT_ROOT = _BUNDLE if INSTALLED else _PACKAGE_ROOT


def work_root() -> Path:
    """The folder the product writes its own files under by default.

    A checkout: the repository root (``deploy/``, ``.flwr-deploy/``, ``data/``, ``runs/``,
    ``mlflow.db``, as the Makefile has them). An installed wheel: the current directory.
    """
    return Path.cwd().resolve() if INSTALLED else _PACKAGE_ROOT
