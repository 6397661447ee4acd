"""Debian programs the tests drive (chromium, dciodvfy...): found on PATH, else skipped, but failed
under CI (``CI`` set), whose ``.ci/run`` installs them, so a missing one is never a silent pass."""

from __future__ import annotations

import os
import shutil

import pytest

__all__ = ["debian_tool"]


def debian_tool(command: str, package: str, purpose: str) -> str:
    """The path of ``command``; skip without it, fail under CI.

    Parameters
    ----------
    command : str
        The program (``chromium``, ``dciodvfy``).
    package : str
        Debian's package that installs it (named in the message).
    purpose : str
        What needs it, e.g. ``"the console's browser tests must run"``.
    """
    found = shutil.which(command)
    if found:
        return found
    why = f"Debian's {command} is not installed (apt-get install {package}; .ci/run does it as root)"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {why}: {purpose}", pytrace=False)
    pytest.skip(why)
