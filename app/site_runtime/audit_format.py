"""The audit log's format on disk, shared by its writer and its verifier.

Under ``<state-dir>/audit/``: ``audit.jsonl`` (the segment being written),
``audit-<first seq, 9 digits>.jsonl`` (segments rotated out by size), ``head.json``
(``{"seq", "hash"}`` of the last record) and ``.lock``. A record is one line of
canonical JSON (:func:`canonical_json`); its ``hash`` is the SHA-256 of that JSON
without the ``hash`` key, so with ``prev``, the previous record's hash
(:data:`GENESIS` before the first record): :func:`record_hash`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "AUDIT_DIR", "CURRENT_NAME", "HEAD_NAME", "LOCK_NAME", "GENESIS", "audit_dir",
    "canonical_json", "record_hash", "segment_name", "segment_paths", "last_line",
]

AUDIT_DIR = "audit"
CURRENT_NAME = "audit.jsonl"
HEAD_NAME = "head.json"
LOCK_NAME = ".lock"
GENESIS = "0" * 64
#: A rotated segment's name: its first record's seq, 9 digits.
SEGMENT = re.compile(r"audit-(\d{9})\.jsonl")


def audit_dir(state_dir: str | Path) -> Path:
    """Return the audit folder of a site's state dir, ``<state-dir>/audit``."""
    return Path(state_dir) / AUDIT_DIR


def canonical_json(record: Mapping[str, Any]) -> bytes:
    """Return ``record`` as the log writes it: sorted keys, no spaces, UTF-8, no NaN."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def record_hash(record: Mapping[str, Any]) -> str:
    """Return the SHA-256 hex of ``record``'s canonical JSON without its ``hash`` key."""
    body = {key: value for key, value in record.items() if key != "hash"}
    return hashlib.sha256(canonical_json(body)).hexdigest()


def segment_name(first_seq: int) -> str:
    """Return the name of the rotated segment whose first record has ``first_seq``."""
    return f"audit-{first_seq:09d}.jsonl"


def segment_paths(folder: Path) -> list[tuple[int, Path]]:
    """Return ``(first seq, path)`` of each rotated segment in ``folder``, in seq order."""
    if not folder.is_dir():
        return []
    found = ((SEGMENT.fullmatch(path.name), path) for path in folder.iterdir())
    return sorted((int(match.group(1)), path) for match, path in found if match)


def last_line(path: Path) -> tuple[bytes | None, bool]:
    """Return the last complete line of ``path`` (without its newline) and whether a torn
    line (no final newline) follows it; ``(None, False)`` for a missing or empty file."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            block = 4096
            while True:
                start = max(size - block, 0)
                handle.seek(start)
                data = handle.read(size - start)
                torn = not data.endswith(b"\n")
                complete = data if not torn else data[:data.rfind(b"\n") + 1]
                lines = complete[:-1].rsplit(b"\n", 1) if complete else []
                if len(lines) == 2 or start == 0:
                    return (lines[-1] if lines else None), torn and bool(data)
                block *= 4
    except FileNotFoundError:
        return None, False
