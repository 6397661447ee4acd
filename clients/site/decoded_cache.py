"""A site's decoded training, validation and test data, cached on the site's own disk.

In deployment every train / evaluate / query message runs in a fresh ClientApp
process, so without a cache each message would re-read and re-decode the
site's DICOM series, NIfTI masks and radiographs, and redo the windowing and
resizing. :func:`load_task` keeps the fully built :class:`SiteTask` (decoded,
windowed, resized tensors and the load report) as one ``.npz`` file under the
site's state directory and reuses it while nothing it depends on has changed:

* the site folder's path and its files (relative path, size and modification
  time of every file under it, the state directory excluded),
* the task and its settings (image size, slab, depth, ...),
* the data-layer code (the source of the ``clients`` package): what a task
  stores (e.g. its ``test_set`` beside ``train_set`` and ``val_set``) is
  defined by that code, so a change of what is stored is a change of key.

Any change gives a new key and a rebuild; an unreadable cache file is logged,
removed and rebuilt. Files are written atomically (temporary file, then
rename). The cache holds patient images: it lives in the state directory,
which, like the data, must stay inside the hospital and be readable only by
the SuperNode's account; the cache folder is created ``0700`` and a cache
folder that is a link, not the SuperNode account's, or open to group or
others is neither read nor written.

No pickle: the file holds the tensors and arrays and a JSON description of
the objects around them (:func:`encode_task`), read with
``allow_pickle=False``. Reading it builds only classes of the already imported
``clients`` package, by setting their attributes, so a planted file cannot run
code in the SuperNode.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from stat import S_IMODE, S_ISDIR, S_ISLNK
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clients.site.atomic_file import write_atomic
from clients.training.site_task import SiteTask, TaskSettings

__all__ = ["CACHE_DIR_NAME", "KEEP_PER_TASK", "cache_key", "decode_task", "encode_task",
           "load_task"]

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


_PLAIN = (type(None), bool, int, float, str)
_PACKAGE = "clients."


def encode_task(value: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """A JSON tree of ``value`` and the arrays (tensors as numpy) it refers to by name.

    Nodes: None/bool/int/float/str as themselves; ``{"t": kind, "v": ...}`` for
    ``list``, ``tuple``, ``dict`` (``[[key, node], ...]``), ``path``, ``np``
    (a numpy scalar), ``array`` / ``tensor`` (an array name) and ``object``
    (a ``clients`` class and its attributes). Anything else is a TypeError.
    """
    arrays: dict[str, np.ndarray] = {}

    def encode(v: Any) -> Any:
        if isinstance(v, _PLAIN) and not isinstance(v, np.generic):
            return v
        if isinstance(v, (torch.Tensor, np.ndarray)):
            name = str(len(arrays))
            tensor = isinstance(v, torch.Tensor)
            arrays[name] = v.detach().cpu().numpy() if tensor else v
            return {"t": "tensor" if tensor else "array", "v": name}
        if isinstance(v, np.generic):
            return {"t": "np", "dtype": v.dtype.str, "v": v.item()}
        if isinstance(v, Path):
            return {"t": "path", "v": str(v)}
        if isinstance(v, (list, tuple)):
            return {"t": type(v).__name__ if type(v) in (list, tuple) else "list",
                    "v": [encode(x) for x in v]}
        if isinstance(v, dict):
            return {"t": "dict", "v": [[encode(k), encode(x)] for k, x in v.items()]}
        cls = type(v)
        if cls.__module__.startswith(_PACKAGE) and hasattr(v, "__dict__"):
            return {"t": "object", "type": f"{cls.__module__}:{cls.__qualname__}",
                    "v": {k: encode(x) for k, x in vars(v).items()}}
        raise TypeError(f"cannot cache a {cls.__module__}.{cls.__qualname__}")

    return encode(value), arrays


def _class(name: str) -> type:
    """A class of an already imported ``clients`` module (nothing is imported)."""
    module, _, qualname = str(name).partition(":")
    if not module.startswith(_PACKAGE) or module not in sys.modules:
        raise TypeError(f"class {name!r} is not of the loaded clients package")
    found: Any = sys.modules[module]
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if not isinstance(found, type):
        raise TypeError(f"{name!r} is not a class")
    return found


def decode_task(node: Any, arrays: dict[str, np.ndarray]) -> Any:
    """The value :func:`encode_task` described (TypeError/KeyError/ValueError if malformed)."""
    if isinstance(node, _PLAIN):
        return node
    kind, value = node["t"], node["v"]
    if kind in ("array", "tensor"):
        array = arrays[value]
        return torch.from_numpy(array) if kind == "tensor" else array
    if kind == "np":
        return np.dtype(node["dtype"]).type(value)
    if kind == "path":
        return Path(value)
    if kind in ("list", "tuple"):
        items = [decode_task(x, arrays) for x in value]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {decode_task(k, arrays): decode_task(x, arrays) for k, x in value}
    if kind == "object":
        cls = _class(node["type"])
        obj = cls.__new__(cls)
        for key, item in value.items():
            object.__setattr__(obj, str(key), decode_task(item, arrays))
        return obj
    raise ValueError(f"unknown cache node kind {kind!r}")


def _write(handle, task: SiteTask) -> None:
    tree, arrays = encode_task(task)
    entries = {f"a{name}": array for name, array in arrays.items()}
    entries["tree"] = np.frombuffer(json.dumps(tree).encode(), dtype=np.uint8)
    np.savez(handle, **entries)


def _read(path: Path) -> Any:
    with np.load(path, allow_pickle=False) as npz:
        tree = json.loads(npz["tree"].tobytes().decode())
        arrays = {k[1:]: npz[k] for k in npz.files if k != "tree"}
    return decode_task(tree, arrays)


def _private(cache_dir: Path) -> bool:
    """Create ``cache_dir`` 0700; ``False`` (logged) if it is a link, not ours or open."""
    if not cache_dir.exists():
        cache_dir.mkdir(mode=0o700, parents=True)
        os.chmod(cache_dir, 0o700)
    info = os.lstat(cache_dir)
    if (S_ISLNK(info.st_mode) or not S_ISDIR(info.st_mode)
            or info.st_uid != os.getuid() or info.st_mode & 0o077):
        log.warning("decoded-data cache folder %s not used: it must be a folder of this user "
                    "with mode 0700 (it is %04o, uid %d); `chmod 700 %s`", cache_dir,
                    S_IMODE(info.st_mode), info.st_uid, cache_dir)
        return False
    return True


def _prune(cache_dir: Path, task_name: str, keep: Path) -> None:
    for legacy in cache_dir.glob(f"{task_name}-*.pkl"):  # pickles of older versions
        legacy.unlink(missing_ok=True)
    older = sorted((p for p in cache_dir.glob(f"{task_name}-*.npz") if p != keep),
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
    try:
        if not _private(cache_dir):
            return task_cls(site_dir, settings)
    except OSError as exc:  # a read-only disk must not stop training
        log.warning("could not create the decoded-data cache %s: %s", cache_dir, exc)
        return task_cls(site_dir, settings)
    exclude = [*exclude, cache_dir]
    started = time.monotonic()
    path = cache_dir / f"{task_cls.name}-{cache_key(task_cls, site_dir, settings, exclude)}.npz"
    if path.is_file():
        try:
            task = _read(path)
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
        write_atomic(path, lambda handle: _write(handle, task))
        _prune(cache_dir, task_cls.name, keep=path)
    except (OSError, TypeError) as exc:  # a full disk must not stop training
        log.warning("could not write the decoded-data cache %s: %s", path, exc)
    return task
