"""The ServerApp's and the sites' log lines are printed once: no import adds a root handler."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_importing_the_apps_leaves_the_root_logger_without_handlers():
    """opacus and mlflow.pytorch call logging.basicConfig at import (found: every line twice)."""
    code = ("import logging, app.server_app, app.client_app; "
            "from clients.training.opacus_loader import opacus; opacus('validators'); "
            "opacus('accountants'); print(len(logging.getLogger().handlers))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=300).stdout
    assert out.strip().splitlines()[-1] == "0"
