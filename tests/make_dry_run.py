"""``make -n``: the commands a make target would run, for tests of the Makefile's wiring."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["make_n"]


def make_n(*args: str) -> str:
    """The output of ``make -n ARGS`` in the repository (skips the test without make)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    done = subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout
