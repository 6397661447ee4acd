"""A site whose manifest is broken: what a task's loader raises (the tasks' manifest tests)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from clients.errors import ManifestError


def manifest_error(site: Path, name: str, text: str | None, load: Callable[[Path], object]) -> ManifestError:
    """The :class:`ManifestError` ``load(site)`` raises when the manifest ``name`` holds ``text``.

    ``text`` None leaves the site without a manifest.
    """
    if text is not None:
        (site / name).write_text(text, encoding="utf-8")
    with pytest.raises(ManifestError) as info:
        load(site)
    return info.value
