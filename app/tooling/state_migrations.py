"""The format version of the folders the product keeps between releases, and their migrations.

Two folders outlive an upgrade of the product (docs/DEPLOYMENT-REFERENCE.md, "Upgrades"):

* a hospital's **site state folder** (:data:`SITE_STATE`, the SuperNode's ``state-dir``:
  privacy ledgers, audit log, query counts, federations' state);
* the **coordinator's SuperLink folder** (:data:`COORDINATOR`,
  ``<deploy>/superlink/``: ``sites.json`` beside Flower's ``state.db``).

Each holds its format version in :data:`FORMAT_FILE` (``{"kind", "version", ...}``);
**no file is version 0**, the layout of release 054dc2f, which wrote none. Version ``N``
is reached by the migration of that kind registered with ``version = N`` (a
:class:`Migration` in :data:`MIGRATIONS`, one module of :mod:`app.tooling.migrations`); this release's version of a kind is the
highest version registered for it (0 while none is). The first real format change
registers the first migration and so stamps its folders.

:func:`migrate_folder` is called where each folder's user starts: the SuperNode
(:meth:`app.site_runtime.supernode.SuperNodeProcess.start`) and the SuperLink
(:meth:`app.tooling.superlink.SuperLinkProcess.start_tls`). It

* refuses a folder written by a **newer** release (:class:`StateFormatError`, naming the
  file and both versions): this release would misread it, and its own writes would
  corrupt it for the newer one;
* stamps an empty (new) folder with this release's version;
* otherwise applies, in order, every migration from the folder's version to this
  release's, after copying the folder to a backup beside it (``.<name>.migrating``):
  a migration that fails leaves the folder as it was (the backup is moved back) and
  raises :class:`StateFormatError`; a start killed mid-migration finds the backup at
  its next start and puts it back before it migrates again.

Flower's ``state.db`` is migrated by Flower itself (its alembic revisions, when the
SuperLink starts); the server checkpoint keeps its own format version inside the file
(:mod:`strategies.rounds.checkpoint`), checked when it is read.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol, runtime_checkable

from clients.site.atomic_file import write_atomic
from strategies.wire.errors import FederationError
from strategies.wire.registry import Registry

__all__ = ["COORDINATOR", "FORMAT_FILE", "MIGRATIONS", "SITE_STATE", "FolderFormat",
           "Migration", "StateFormatError", "current_version", "folder_version",
           "migrate_folder"]

#: The format marker of a folder, at its top.
FORMAT_FILE = "fedmed-format.json"
#: The kind of a hospital's state folder (the SuperNode's ``state-dir``).
SITE_STATE = "site-state"
#: The kind of the coordinator's SuperLink folder (``<deploy>/superlink/``).
COORDINATOR = "coordinator"
#: The backup of a folder being migrated, beside it: ``.<folder name><suffix>``.
BACKUP_SUFFIX = ".migrating"


class StateFormatError(FederationError):
    """A state folder this release cannot use: written by a newer release, a malformed
    format marker, or a migration that failed (the folder was left as it was)."""


@runtime_checkable
class Migration(Protocol):
    """One format change of one folder kind: from ``version - 1`` to ``version``.

    ``apply`` rewrites the folder in place; it may raise anything (the folder is then
    restored from its backup). It must not touch anything outside ``folder``.
    """

    kind: str
    version: int
    description: str

    def apply(self, folder: Path) -> None:
        """Rewrite ``folder`` from format ``version - 1`` to ``version``."""


#: Every migration of the product, registered as ``"<kind>:<version>"`` by the modules of
#: :mod:`app.tooling.migrations` (one per format change), imported on the first lookup.
MIGRATIONS: Registry[Migration] = Registry("state migration", "state-format",
                                           package="app.tooling.migrations")


@dataclass(frozen=True)
class FolderFormat:
    """What :func:`migrate_folder` found and did."""

    folder: Path
    kind: str
    #: The version the folder had (0: no marker; None: a new, empty folder).
    found: int | None
    #: The version it has now.
    version: int
    #: The migrations applied, in order (their ``version``).
    applied: tuple[int, ...] = ()


def _migrations(kind: str, registry: Registry[Migration]) -> list[Migration]:
    """The migrations of ``kind``, in version order; their versions must be 1, 2, ... N."""
    found = sorted((m for m in registry.entries().values() if m.kind == kind),
                   key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise StateFormatError(f"the {kind} migrations registered have versions {versions}; "
                               f"they must be 1, 2, ... each once")
    return found


def current_version(kind: str, registry: Registry[Migration] = MIGRATIONS) -> int:
    """This release's format version of ``kind``: its highest migration's (0: none)."""
    return len(_migrations(kind, registry))


def folder_version(folder: Path, kind: str) -> int:
    """The format version :data:`FORMAT_FILE` of ``folder`` records (0: no marker).

    Raises
    ------
    StateFormatError
        The marker is unreadable, malformed, or of another kind of folder.
    """
    marker = Path(folder) / FORMAT_FILE
    if not marker.is_file():
        return 0
    try:
        saved = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateFormatError(f"{marker}: unreadable format marker ({exc})") from exc
    version = saved.get("version") if isinstance(saved, dict) else None
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise StateFormatError(f"{marker}: 'version' must be an integer >= 1, got {version!r}")
    if saved.get("kind") != kind:
        raise StateFormatError(f"{marker}: a {saved.get('kind')!r} folder, not a {kind!r} one "
                               "(is this the right folder?)")
    return version


def _stamp(folder: Path, kind: str, version: int, applied: Iterable[int]) -> None:
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    text = json.dumps({"kind": kind, "version": version, "written": now,
                       "migrations-applied": list(applied)}, indent=2) + "\n"
    write_atomic(folder / FORMAT_FILE, lambda handle: handle.write(text.encode()))


def _backup_of(folder: Path) -> Path:
    return folder.parent / f".{folder.name}{BACKUP_SUFFIX}"


def _put_back(folder: Path, backup: Path) -> None:
    """Replace ``folder`` by its backup (``folder`` is the product's own state folder)."""
    if folder.exists():
        shutil.rmtree(folder)
    backup.rename(folder)


def migrate_folder(folder: Path, kind: str,
                   registry: Registry[Migration] = MIGRATIONS) -> FolderFormat:
    """Bring ``folder`` (of ``kind``) to this release's format; see the module docstring.

    Parameters
    ----------
    folder : Path
        The state folder (need not exist: a new folder is stamped when created later).
    kind : str
        :data:`SITE_STATE` or :data:`COORDINATOR`.
    registry : Registry
        The migrations (default :data:`MIGRATIONS`; tests pass their own).

    Raises
    ------
    StateFormatError
        The folder is of a newer format than this release's, its marker is malformed,
        or a migration failed (the folder is then as it was before).
    """
    folder = Path(folder)
    backup = _backup_of(folder)
    if backup.is_dir():  # a start killed mid-migration: the folder may be half-migrated
        _put_back(folder, backup)
    migrations = _migrations(kind, registry)
    current = len(migrations)
    if not folder.is_dir():
        return FolderFormat(folder, kind, None, current)
    found = folder_version(folder, kind)
    marker = folder / FORMAT_FILE
    if found > current:
        raise StateFormatError(
            f"{marker}: {kind} folder {folder} has format version {found}, written by a newer "
            f"release; this release reads version {current} and older. Run the newer "
            "release, or restore this folder from the backup made before the upgrade")
    if found == current:
        return FolderFormat(folder, kind, found, current)
    if not any(folder.iterdir()):  # new: nothing to migrate
        _stamp(folder, kind, current, ())
        return FolderFormat(folder, kind, None, current)
    pending = migrations[found:]
    shutil.copytree(folder, backup, symlinks=True)
    applied: list[int] = []
    try:
        for migration in pending:
            migration.apply(folder)
            applied.append(migration.version)
        _stamp(folder, kind, current, applied)
    except Exception as exc:
        _put_back(folder, backup)
        failed = pending[len(applied)]
        raise StateFormatError(
            f"{marker}: migrating {kind} folder {folder} from format version {found} to "
            f"{current} failed in migration {failed.version} ({failed.description}): "
            f"{exc!r}; the folder was left as it was (version {found})") from exc
    shutil.rmtree(backup)
    return FolderFormat(folder, kind, found, current, tuple(applied))
