"""Importing a library that configures the root logger, without letting it.

``opacus.utils.module_utils`` and ``mlflow.pytorch._lightning_autolog`` call
``logging.basicConfig`` when imported: a root handler that prints every Flower
log line of the ServerApp and of the sites a second time. Their imports run
inside :func:`root_logging_kept`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["root_logging_kept"]


@contextmanager
def root_logging_kept() -> Iterator[None]:
    """Restore the root logger's handlers and level as they were on entry."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
