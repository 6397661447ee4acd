"""A site's decoded training and validation data, cached on the site's own disk.

In deployment every train / evaluate / query message runs in a fresh ClientApp
process, so without a cache each message would re-read and re-decode the
site's DICOM series, NIfTI masks and radiographs, and redo the windowing and
resizing. :func:`load_task` keeps the fully built :class:`SiteTask` (decoded,
windowed, resized tensors and the load report) as one pickle under the site's
state directory and reuses it while nothing it depends on has changed:

* the site folder's path and its files (relative path, size and modification
  time of every file under it, the state directory excluded),
* the task and its settings (image size, slab, depth, ...),
* the data-layer code (the source of the ``clients`` package).

Any change gives a new key and a rebuild; an unreadable cache file is logged,
removed and rebuilt. Files are written atomically (temporary file, then
rename). The cache holds patient images: it lives in the state directory,
which, like the data, must stay inside the hospital and be readable only by
the SuperNode's account. Pickle is used because the cache is written and read
by the same site software on the same disk; never point ``state-dir`` at a
folder others can write to.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import time
from collections.abc import Iterable
from pathlib import Path

from clients.site.atomic_file import write_atomic
from clients.training.site_task import SiteTask, TaskSettings

__all__ = ["CACHE_DIR_NAME", "KEEP_PER_TASK", "cache_key", "load_task"]

log = logging.getLogger(__name__)

#: Folder of the cache files under a site's state directory.
CACHE_DIR_NAME = "decoded-cache"
#: Cache files kept per task (different settings of one task get different files).
KEEP_PER_TASK = 3

#: The site-side code (all of ``clients/``): a change to any reader invalidates the cache.
_CODE_DIR = Path(__file__).resolve().parents[1]


def _code_fingerprint() -> str:
    digest = hashlib.sha256()
    for path in sorted(_CODE_DIR.rglob("*.py")):
        digest.update(path.relative_to(_CODE_DIR).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _files_fingerprint(site_dir: Path, exclude: Iterable[Path]) -> str:
    """Relative path, size and mtime of every file under ``site_dir``, minus ``exclude``."""
    site_dir = Path(site_dir).resolve()
    skip = {Path(p).resolve() for p in exclude}
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(site_dir):
        root_path = Path(root)
        dirs[:] = sorted(d for d in dirs if (root_path / d).resolve() not in skip)
        for name in sorted(files):
            path = root_path / name
            try:
                stat = path.stat()
            except OSError:  # vanished or a dangling link: part of the key as such
                digest.update(f"{path.relative_to(site_dir)}:missing\n".encode())
                continue
            digest.update(f"{path.relative_to(site_dir)}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def cache_key(task_cls: type[SiteTask], site_dir: Path, settings: TaskSettings,
              exclude: Iterable[Path] = ()) -> str:
    """The key of a site's decoded data: folder and files, task, settings, data-layer code."""
    digest = hashlib.sha256()
    for part in (task_cls.name, str(Path(site_dir).resolve()), repr(settings),
                 _code_fingerprint(), _files_fingerprint(site_dir, exclude)):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:32]


def _prune(cache_dir: Path, task_name: str, keep: Path) -> None:
    older = sorted((p for p in cache_dir.glob(f"{task_name}-*.pkl") if p != keep),
                   key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in older[KEEP_PER_TASK - 1:]:
        stale.unlink(missing_ok=True)


def load_task(task_cls: type[SiteTask], site_dir: Path, settings: TaskSettings,
              cache_dir: Path | None, exclude: Iterable[Path] = ()) -> SiteTask:
    """The site's task, from the cache when its key matches, else built and cached.

    Parameters
    ----------
    task_cls : type of SiteTask
        The task (its ``name`` is part of the key).
    site_dir : Path
        The site folder.
    settings : TaskSettings
        The task's settings (part of the key).
    cache_dir : Path or None
        Where the cache files live; ``None`` disables caching.
    exclude : iterable of Path
        Folders under ``site_dir`` that are not data (the state directory,
        which holds this cache), left out of the files' fingerprint.

    Raises
    ------
    SiteDataError, StudyError, ManifestError
        As the task's constructor; a failed build is never cached.
    """
    if cache_dir is None:
        return task_cls(site_dir, settings)
    cache_dir = Path(cache_dir)
    exclude = [*exclude, cache_dir]
    started = time.monotonic()
    path = cache_dir / f"{task_cls.name}-{cache_key(task_cls, site_dir, settings, exclude)}.pkl"
    if path.is_file():
        try:
            with path.open("rb") as handle:
                task = pickle.load(handle)
            if not isinstance(task, task_cls):
                raise TypeError(f"holds a {type(task).__name__}, not a {task_cls.__name__}")
            log.info("%s: decoded %s data from the cache (%.2fs)", Path(site_dir).name,
                     task_cls.name, time.monotonic() - started)
            return task
        except Exception as exc:  # noqa: BLE001 - any unreadable cache is rebuilt
            log.warning("decoded-data cache %s unreadable (%s: %s); rebuilding it",
                        path, type(exc).__name__, exc)
            path.unlink(missing_ok=True)
    task = task_cls(site_dir, settings)
    try:
        write_atomic(path, lambda handle: pickle.dump(task, handle, protocol=pickle.HIGHEST_PROTOCOL))
        _prune(cache_dir, task_cls.name, keep=path)
    except OSError as exc:  # a full or read-only disk must not stop training
        log.warning("could not write the decoded-data cache %s: %s", path, exc)
    return task
