"""No source file is over 600 lines (the developers' guide: a file near 400 lines is a signal
to look, not a reason to split a concept; keep each under 600)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("app", "strategies", "clients", "models", "bench", "tests")
MAX_LINES = 600


def test_no_source_file_is_over_600_lines():
    long_files = sorted(
        f"{path.relative_to(ROOT)}: {count} lines"
        for folder in FOLDERS for path in (ROOT / folder).rglob("*.py") if "__pycache__" not in path.parts
        for count in [len(path.read_text(encoding="utf-8").splitlines())] if count > MAX_LINES)
    assert not long_files, f"over {MAX_LINES} lines:\n" + "\n".join(long_files)
