"""Import first in a single-threaded benchmark: one BLAS/OpenMP thread, the project importable.

numpy and torch read the thread-count variables when they load, so this module
must be imported before them (``import single_thread`` as the script's first
import; ``python bench/<script>.py`` has ``bench/`` on ``sys.path``, and the
tests put it there too). It also puts the repository root on ``sys.path`` so a
script runs from a checkout without the editable install.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["THREAD_VARS", "BENCH", "ROOT"]

#: The variables BLAS / OpenMP libraries read for their thread pools.
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)
for _var in THREAD_VARS:
    os.environ[_var] = "1"

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
for _path in (str(ROOT), str(BENCH)):
    if _path not in sys.path:
        sys.path.insert(0, _path)
