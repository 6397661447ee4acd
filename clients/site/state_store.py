"""Site state that must outlive a SuperNode restart, kept on the site's disk.

Flower's ``context.state`` lives in the SuperNode's memory and is lost when it
restarts. What a site must not lose (e.g. its error-feedback residual of the
update compression) is written here, under the ``state-dir`` of its node
config, one file per federation and name, atomically (write to a temporary file,
then rename), so a crash mid-write never leaves a truncated state.

The coordinator chooses federation ids, so their folder names must never meet
(:meth:`SiteStateStore.folder`): an id made only of ``A-Z a-z 0-9 _ . -`` (at most
:data:`PLAIN_MAX` characters, not dot-only) is its own folder name, as it always was;
any other id is ``<the id with every other character as _, cut to 64>~<first 32 hex
of the id's SHA-256>``. ``~`` never occurs in a plain name, so an encoded folder is
never a plain id's; two encoded ids share a folder only if their SHA-256 share 128
bits (no one can choose an id for that).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np

from clients.site.atomic_file import write_atomic

__all__ = ["PLAIN_MAX", "SiteStateStore", "federation_folder_name"]

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
#: The longest id kept as its own folder name (a file name holds 255 bytes).
PLAIN_MAX = 255
#: Characters of the readable part of an encoded folder name.
_READABLE = 64
#: Hex digits of the id's SHA-256 in an encoded folder name (128 bits).
_DIGEST_HEX = 32
#: Between the readable part and the digest: a character no plain name holds.
_SEPARATOR = "~"


def federation_folder_name(federation: str) -> str:
    """The folder name of ``federation``'s state (the module docstring's encoding).

    Raises
    ------
    ValueError
        ``federation`` is empty or dot-only (its folder would leave the state dir).
    """
    if not federation or set(federation) <= {"."}:
        raise ValueError(f"federation {federation!r}: an empty or dot-only name would "
                         "leave the state dir")
    if len(federation) <= PLAIN_MAX and not _SAFE.search(federation):
        return federation
    digest = hashlib.sha256(federation.encode("utf-8")).hexdigest()
    return f"{_SAFE.sub('_', federation)[:_READABLE]}{_SEPARATOR}{digest[:_DIGEST_HEX]}"


class SiteStateStore:
    """Arrays saved under ``<state_dir>/<federation>/<name>.npy``."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)

    def folder(self, federation: str) -> Path:
        """``<state_dir>/<folder name>/`` (:func:`federation_folder_name`): every place
        that keeps a federation's state on the site's disk goes through here."""
        return self.state_dir / federation_folder_name(federation)

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
