"""The app bundle (FAB) of a project folder, built without walking what no bundle holds.

Flower's builder (``flwr.cli.build.build_fab_from_disk``, Flower 1.42) first
lists every file under the project (``flwr.cli.utils.collect_files``: ``os.walk``
and a ``resolve()`` per file) and only then filters them. In a checkout with its
virtual environment that is about 60,000 files for a bundle of about 260: 15 s
of CPU, and 20-60 s of wall time on two loaded cores, for every ``flwr run``,
``make sign-app`` and ``make approve-app``.

:func:`project_files` skips a folder when Flower's own rules drop every file in
it (the publish excludes ``flwr.supercore.constant.APP_PUBLISH_EXCLUDE_PATTERNS``
or the project's ``.gitignore``; never when the ``.gitignore`` re-includes
anything with ``!``) and hands the rest to Flower's builder, so the bundle's
bytes and hash are Flower's. :func:`staged_project` unpacks the bundle into a
folder of its own, which ``flwr run`` then bundles in well under a second into
the same bytes.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import time
import zipfile
from pathlib import Path

from flwr.cli.build import build_fab_from_files
from flwr.cli.utils import build_pathspec, load_gitignore_patterns
from flwr.supercore.constant import APP_PUBLISH_EXCLUDE_PATTERNS

__all__ = ["project_files", "build_project_fab", "staged_project"]

#: A file name that every include rule of a bundle accepts (a ``.py`` file).
_PROBE = "probe.py"


def _pruner(root: Path):
    """``dropped(relative_dir)``: whether Flower's rules drop every file under that folder."""
    gitignore = root / ".gitignore"
    patterns = list(load_gitignore_patterns(gitignore.read_bytes() if gitignore.is_file()
                                            else b""))
    if any(str(p).lstrip().startswith("!") for p in patterns):
        return lambda relative: False  # a re-include could rescue a file: walk everything
    spec = build_pathspec((*APP_PUBLISH_EXCLUDE_PATTERNS, *patterns))
    return lambda relative: bool(spec.match_file(f"{relative}/{_PROBE}"))


def project_files(project_dir: Path) -> dict[str, Path]:
    """Flower's ``collect_files(project_dir)`` without the folders its rules drop entirely.

    Same contract as Flower's: relative POSIX path -> absolute path; symlinks and
    paths resolving outside the project are left out.
    """
    root = Path(project_dir).resolve()
    dropped = _pruner(root)
    files: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        relative_dir = here.relative_to(root).as_posix()
        dirnames[:] = [d for d in dirnames if not dropped(
            d if relative_dir == "." else f"{relative_dir}/{d}")]
        for filename in filenames:
            path = here / filename
            if path.is_symlink() or not path.resolve().is_relative_to(root):
                continue
            files[path.relative_to(root).as_posix()] = path
    return files


def build_project_fab(project_dir: Path) -> bytes:
    """The bundle ``flwr run <project_dir>`` submits (Flower's builder, on :func:`project_files`)."""
    return build_fab_from_files(project_files(project_dir))[0]


#: Staged bundles not used for this long are deleted when another one is staged.
STALE_AFTER_S = 24 * 3600.0


def _drop_stale(staging_root: Path, keep: str) -> None:
    """Delete staged bundles (this module's folders only) unused for :data:`STALE_AFTER_S`."""
    if not staging_root.is_dir():
        return
    now = time.time()
    for folder in staging_root.iterdir():
        ours = len(folder.name) == 16 and all(c in "0123456789abcdef" for c in folder.name)
        if ours and folder.name != keep and (folder / "pyproject.toml").is_file() \
                and now - folder.stat().st_mtime > STALE_AFTER_S:
            shutil.rmtree(folder, ignore_errors=True)


def staged_project(project_dir: Path, staging_root: Path) -> Path:
    """A folder that holds exactly the bundle of ``project_dir``, for ``flwr run``.

    The bundle is unpacked once into ``staging_root/<first 16 hex of its sha256>``
    and reused while the project's bundle is the same; ``flwr run`` on it submits
    the bundle ``build_project_fab(project_dir)`` returns, byte for byte.
    """
    fab = build_project_fab(project_dir)
    target = Path(staging_root) / hashlib.sha256(fab).hexdigest()[:16]
    _drop_stale(Path(staging_root), keep=target.name)
    if (target / "pyproject.toml").is_file():
        os.utime(target)  # in use: not stale
    else:
        partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
        zipfile.ZipFile(io.BytesIO(fab)).extractall(partial)
        try:
            partial.rename(target)
        except OSError:  # another submission staged the same bundle meanwhile
            shutil.rmtree(partial, ignore_errors=True)
            if not (target / "pyproject.toml").is_file():
                raise
    return target
