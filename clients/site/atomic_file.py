"""Write a site-side file atomically: a temporary file in the same folder, then a rename.

A crash (or a SuperNode killed mid-write) leaves either the old file or the new
one, never a truncated file, because ``os.replace`` within one folder is atomic
on POSIX file systems; the new file's data is on the disk (``fsync``) before the
rename, so a power loss cannot leave it renamed but empty.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["write_atomic"]


def write_atomic(path: Path, write: Callable[[BinaryIO], None], durable: bool = True) -> Path:
    """Create ``path``'s folder, call ``write`` on a temporary file there, rename it to ``path``.

    The temporary file is removed if ``write`` raises. Returns ``path``. ``durable=False``
    skips the ``fsync``: for many files of one batch whose writer syncs once at the end
    (``os.sync``) before it records them (the PACS sync's instances).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
