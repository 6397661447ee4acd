"""The benchmark scripts are imported by module name here: ``bench/`` goes on ``sys.path``.

(``python bench/<script>.py`` has it there too; the scripts import
``single_thread`` and each other by name.)
"""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
