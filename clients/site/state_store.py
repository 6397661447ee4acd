"""Site state that must outlive a SuperNode restart, kept on the site's disk.

Flower's ``context.state`` lives in the SuperNode's memory and is lost when it
restarts. What a site must not lose (e.g. its error-feedback residual of the
update compression) is written here, under the ``state-dir`` of its node
config, one file per federation and name, atomically (write to a temporary file,
then rename), so a crash mid-write never leaves a truncated state.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from clients.site.atomic_file import write_atomic

__all__ = ["SiteStateStore"]

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


class SiteStateStore:
    """Arrays saved under ``<state_dir>/<federation>/<name>.npy``."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)

    def folder(self, federation: str) -> Path:
        """``<state_dir>/<federation>/``, the federation's name made safe for a path."""
        if not federation or set(federation) <= {"."}:
            raise ValueError(f"federation {federation!r}: an empty or dot-only name would "
                             "leave the state dir")
        return self.state_dir / _SAFE.sub("_", federation)

    def _path(self, federation: str, name: str) -> Path:
        if not name or set(name) <= {"."}:
            raise ValueError(f"name {name!r}: an empty or dot-only name would leave the state dir")
        return self.folder(federation) / f"{_SAFE.sub('_', name)}.npy"

    def load(self, federation: str, name: str) -> np.ndarray | None:
        """The saved array, or ``None`` if there is none yet."""
        path = self._path(federation, name)
        if not path.exists():
            return None
        return np.load(path, allow_pickle=False)

    def save(self, federation: str, name: str, array: np.ndarray) -> Path:
        """Save ``array`` atomically; returns the file path."""
        return write_atomic(self._path(federation, name),
                            lambda handle: np.save(handle, np.asarray(array), allow_pickle=False))
