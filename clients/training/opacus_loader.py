"""Opacus, imported on first DP use, with the root logger kept as it was.

``import opacus`` takes seconds (5-8 s of CPU on the 2-core machine) and calls
``logging.basicConfig`` (``opacus.utils.module_utils``), which would print every
log line twice (:mod:`clients.root_logging`). A ServerApp and a site that does not
train with DP-SGD never need it, so nothing imports it at module level.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from clients.root_logging import root_logging_kept

__all__ = ["opacus"]


def opacus(submodule: str = "") -> ModuleType:
    """``opacus`` (or ``opacus.<submodule>``), imported now if it was not yet."""
    with root_logging_kept():
        return importlib.import_module(f"opacus.{submodule}" if submodule else "opacus")
