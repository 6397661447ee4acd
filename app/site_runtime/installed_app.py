"""An approved app bundle's install folder, checked against the bundle before every message.

Flower installs a bundle (FAB) once, into ``$FLWR_HOME/apps/<publisher>.<name>.
<version>.<hash8>``, and reuses that folder whenever it exists
(``flwr.cli.install.install_from_fab`` with ``skip_prompt``): an install edited
after the check would keep running under the approval of the original bundle.
So before every message the site runner makes sure the install folder is the
bundle that was just approved (:func:`verified_install`) and, on any
difference, deletes the folder and installs it afresh from the bundle.

Two checks, the second only when the first cannot vouch for the folder:

* the folder's **stat signature** (:func:`install_signature`): every entry's
  relative path, kind, device, inode, size, mtime and ctime. Writing a file,
  replacing it, adding, removing or renaming one changes it; so does resetting
  a file's mtime (``os.utime``), since that sets its ctime, which no
  unprivileged process can set back;
* the **byte compare** (:func:`install_differences`: every file's bytes, no file
  missing, no file added), when the signature differs from the last one that
  was compared byte for byte, or when there is none yet.

A signature is kept only when no entry's ctime or mtime is within
:data:`RACY_NS` of the moment it was taken (git's "racily clean" rule): file
timestamps are coarse (a clock tick, 2 s on some file systems, skewed on network
mounts), so an edit made just after the signature could leave it unchanged;
such a folder is compared byte for byte again on the next message. The stat
signature is taken before the bytes are read, so an edit between the two is
either in the bytes read or changes the next signature.

Flower's own install call (which unpacks and hashes the whole bundle) runs only
when the folder is missing or was found different. A warm message thus costs a
hash of the bundle and one ``lstat`` per installed file (about 10 ms for the
product's 490 files, against 0.3-0.6 s for the install call and the byte compare).
The signatures are this process's: a restarted runner compares in full once.
What a signature cannot see is a writer that sets the clock back or writes the
disk beneath the file system, i.e. root on the host.

The warm workers run with ``PYTHONDONTWRITEBYTECODE=1``
(:func:`worker_env`), so nothing but the bundle's own files belongs in the
folder: a byte-code file there is a difference like any other.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import time
import zipfile
from pathlib import Path

from flwr.cli.install import install_from_fab
from flwr.supercore.utils import get_flwr_home

from app.tooling.errors import FlowerProcessError

__all__ = ["worker_env", "RACY_NS", "install_signature", "install_differences",
           "verified_install"]

def worker_env() -> dict[str, str]:
    """The runner's environment as it is now, without byte-code files written into the
    install folder (read at each worker's start: ``FLWR_HOME`` may be set after import)."""
    return {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
#: The bundle's own metadata folder, which Flower removes when it installs.
_INFO = ".info/"
#: A signature with an entry changed less than this long before it was taken is not kept.
RACY_NS = 2_000_000_000

#: One entry of a signature: relative path, file type bits, device, inode, size, mtime, ctime.
Entry = tuple[str, int, int, int, int, int, int]

#: ``(FLWR_HOME, bundle sha256) -> (install folder, its signature when last found equal)``.
_verified: dict[tuple[str, str], tuple[Path, tuple[Entry, ...]]] = {}


def _entries(install_dir: Path) -> dict[str, tuple[str, os.stat_result]]:
    """Every entry of ``install_dir`` that is not a real folder (links to folders included):
    relative path -> (path, its ``lstat``).

    Empty when the folder does not exist; a folder that vanishes while it is walked
    adds nothing. A folder that cannot be read raises (nothing is vouched for).
    """
    found: dict[str, tuple[str, os.stat_result]] = {}
    pending = [(str(install_dir), "")]
    while pending:
        folder, prefix = pending.pop()
        try:
            with os.scandir(folder) as listing:
                for entry in listing:
                    info = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(info.st_mode):
                        pending.append((entry.path, f"{prefix}{entry.name}/"))
                    else:
                        found[prefix + entry.name] = (entry.path, info)
        except (FileNotFoundError, NotADirectoryError):
            continue
    return found


def install_signature(install_dir: Path) -> tuple[Entry, ...]:
    """The stat signature of ``install_dir``: one :data:`Entry` per entry, sorted by path.

    Empty when the folder does not exist.
    """
    return tuple(sorted((name, stat.S_IFMT(info.st_mode), info.st_dev, info.st_ino,
                         info.st_size, info.st_mtime_ns, info.st_ctime_ns)
                        for name, (_, info) in _entries(install_dir).items()))


def _racy(signature: tuple[Entry, ...], taken_ns: int) -> bool:
    """Whether an entry of ``signature`` changed within :data:`RACY_NS` of ``taken_ns``."""
    return any(max(entry[5], entry[6]) > taken_ns - RACY_NS for entry in signature)


def install_differences(install_dir: Path, fab_bytes: bytes) -> list[str]:
    """Paths (relative, sorted) where ``install_dir`` differs from the bundle ``fab_bytes``.

    A file is different when its bytes differ, when the bundle has it and the
    folder does not, or when the folder has it (a link included) and the bundle
    does not.
    """
    with zipfile.ZipFile(io.BytesIO(fab_bytes)) as bundle:
        expected = {info.filename: bundle.read(info) for info in bundle.infolist()
                    if not info.is_dir() and not info.filename.startswith(_INFO)}
    present = _entries(install_dir)
    differences = set(expected.keys() ^ present.keys())
    differences.update(name for name in expected.keys() & present.keys()
                       if not stat.S_ISREG(present[name][1].st_mode)
                       or Path(present[name][0]).read_bytes() != expected[name])
    return sorted(differences)


def _compared(folder: Path, fab_bytes: bytes) -> tuple[tuple[Entry, ...], int, list[str]]:
    """The folder's signature, when it was taken (ns) and its differences from the bundle,
    in that order (the signature before the bytes)."""
    taken_ns = time.time_ns()
    signature = install_signature(folder)
    return signature, taken_ns, install_differences(folder, fab_bytes)


def verified_install(fab_bytes: bytes) -> tuple[Path, list[str]]:
    """The install folder of an approved bundle, equal to the bundle; what was different.

    Installs the bundle when it is not installed yet; when the folder differs
    from the bundle, deletes it and installs it afresh. A folder whose stat
    signature is the one kept when it was last found equal is not read again
    (see the module docstring).

    Returns
    -------
    (Path, list of str)
        The install folder and the differences found before re-installing it
        (empty when the folder was as the bundle says).

    Raises
    ------
    FlowerProcessError
        A fresh install still differs from the bundle (nothing of it may run).
    """
    key = (str(get_flwr_home()), hashlib.sha256(fab_bytes).hexdigest())
    known = _verified.pop(key, None)
    if known is not None and install_signature(known[0]) == known[1]:
        _verified[key] = known
        return known[0], []
    folder = install_from_fab(fab_bytes, skip_prompt=True)
    signature, taken_ns, differences = _compared(folder, fab_bytes)
    if differences:
        shutil.rmtree(folder)
        folder = install_from_fab(fab_bytes, skip_prompt=True)
        signature, taken_ns, still = _compared(folder, fab_bytes)
        if still:
            raise FlowerProcessError(f"the fresh install {folder} differs from its bundle: "
                                     f"{', '.join(still[:5])}")
    if not _racy(signature, taken_ns):
        _verified[key] = (folder, signature)
    return folder, differences
