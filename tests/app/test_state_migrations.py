"""The state folders' migration machinery (app/tooling/state_migrations.py), with migrations
registered here only: the product registers none yet (its folders are all version 0)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.tooling import state_migrations as sm
from strategies.wire.registry import Registry

PERMISSIVE = Path(__file__).resolve().parents[2] / "configs" / "site-policy-permissive.toml"


def _rename(folder: Path) -> None:
    """Version 1 in these tests: ``old.json`` becomes ``new.json`` with a ``v`` key."""
    value = json.loads((folder / "old.json").read_text())
    (folder / "new.json").write_text(json.dumps({"v": value}))
    (folder / "old.json").unlink()


def _fail_half_way(folder: Path) -> None:
    """Version 2 in these tests: writes a file, removes one, then fails."""
    (folder / "half.txt").write_text("written before the failure")
    (folder / "new.json").unlink()
    raise OSError("disk full")


@dataclass
class _Step:
    """A :class:`~app.tooling.state_migrations.Migration` of these tests."""

    version: int
    description: str
    step: Callable[[Path], None]
    kind: str = sm.SITE_STATE

    def apply(self, folder: Path) -> None:
        self.step(folder)


def _Rename() -> _Step:  # noqa: N802 - reads as the migration it builds
    return _Step(1, "old.json -> new.json", _rename)


def _Fails() -> _Step:  # noqa: N802
    return _Step(2, "a migration that fails half-way", _fail_half_way)


def _registry(*migrations: sm.Migration) -> Registry[sm.Migration]:
    registry: Registry[sm.Migration] = Registry("state migration", "state-format")
    for migration in migrations:
        assert isinstance(migration, sm.Migration)
        registry.add(f"{migration.kind}:{migration.version}", migration)
    return registry


def _old_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "state"
    (folder / "privacy").mkdir(parents=True)
    (folder / "old.json").write_text("7")
    (folder / "privacy" / "history.json").write_text('{"entries": []}')
    return folder


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_the_product_registers_no_migration_yet_so_every_folder_is_version_0(tmp_path):
    assert sm.current_version(sm.SITE_STATE) == 0
    assert sm.current_version(sm.COORDINATOR) == 0
    folder = _old_folder(tmp_path)
    before = _tree(folder)
    assert sm.migrate_folder(folder, sm.SITE_STATE).version == 0
    assert _tree(folder) == before  # no marker written while the format is version 0


def test_an_old_folder_is_migrated_in_order_and_stamped(tmp_path):
    folder = _old_folder(tmp_path)
    done = sm.migrate_folder(folder, sm.SITE_STATE, _registry(_Rename()))
    assert (done.found, done.version, done.applied) == (0, 1, (1,))
    assert json.loads((folder / "new.json").read_text()) == {"v": 7}
    assert not (folder / "old.json").exists()
    marker = json.loads((folder / sm.FORMAT_FILE).read_text())
    assert (marker["kind"], marker["version"], marker["migrations-applied"]) == (
        sm.SITE_STATE, 1, [1])
    assert sm.folder_version(folder, sm.SITE_STATE) == 1
    assert not list(tmp_path.glob(f".*{sm.BACKUP_SUFFIX}"))  # the backup is gone
    again = sm.migrate_folder(folder, sm.SITE_STATE, _registry(_Rename()))
    assert (again.found, again.applied) == (1, ())


def test_a_new_empty_folder_is_stamped_without_migrating(tmp_path):
    folder = tmp_path / "fresh"
    folder.mkdir()
    done = sm.migrate_folder(folder, sm.SITE_STATE, _registry(_Rename()))
    assert (done.found, done.version, done.applied) == (None, 1, ())
    assert sm.folder_version(folder, sm.SITE_STATE) == 1


def test_a_failed_migration_leaves_the_folder_as_it_was(tmp_path):
    folder = _old_folder(tmp_path)
    before = _tree(folder)
    with pytest.raises(sm.StateFormatError) as raised:
        sm.migrate_folder(folder, sm.SITE_STATE, _registry(_Rename(), _Fails()))
    text = str(raised.value)
    assert str(folder / sm.FORMAT_FILE) in text
    assert "from format version 0 to 2" in text and "migration 2" in text
    assert "disk full" in text and "left as it was (version 0)" in text
    assert _tree(folder) == before
    assert not list(tmp_path.glob(f".*{sm.BACKUP_SUFFIX}"))


def test_a_start_killed_mid_migration_puts_the_backup_back_first(tmp_path):
    folder = _old_folder(tmp_path)
    before = _tree(folder)
    backup = tmp_path / f".state{sm.BACKUP_SUFFIX}"
    shutil.copytree(folder, backup)
    (folder / "old.json").unlink()  # half-migrated when the machine went down
    (folder / "new.json").write_text("{}")
    done = sm.migrate_folder(folder, sm.SITE_STATE, _registry(_Rename()))
    assert done.applied == (1,)
    assert json.loads((folder / "new.json").read_text()) == {"v": 7}
    assert set(_tree(folder)) == (set(before) - {"old.json"}) | {"new.json", sm.FORMAT_FILE}
    assert not backup.exists()


def test_a_folder_of_a_newer_release_is_refused_naming_the_file_and_both_versions(tmp_path):
    folder = _old_folder(tmp_path)
    (folder / sm.FORMAT_FILE).write_text(json.dumps({"kind": sm.SITE_STATE, "version": 3}))
    before = _tree(folder)
    with pytest.raises(sm.StateFormatError,
                       match=rf"{folder / sm.FORMAT_FILE}: .*format version 3, written by a "
                             r"newer release; this release reads version 1 and older"):
        sm.migrate_folder(folder, sm.SITE_STATE, _registry(_Rename()))
    assert _tree(folder) == before


@pytest.mark.parametrize(("text", "problem"), [
    ("{", "unreadable format marker"),
    ('{"kind": "site-state", "version": "2"}', "'version' must be an integer >= 1"),
    ('{"kind": "coordinator", "version": 1}', "a 'coordinator' folder, not a 'site-state'"),
])
def test_a_malformed_marker_is_refused_naming_it(tmp_path, text, problem):
    folder = _old_folder(tmp_path)
    (folder / sm.FORMAT_FILE).write_text(text)
    with pytest.raises(sm.StateFormatError, match=problem):
        sm.migrate_folder(folder, sm.SITE_STATE, _registry(_Rename()))


def test_migration_versions_must_follow_each_other(tmp_path):
    with pytest.raises(sm.StateFormatError, match=r"versions \[2\]; they must be 1, 2"):
        sm.current_version(sm.SITE_STATE, _registry(_Fails()))


def test_the_supernode_and_the_superlink_start_refuse_a_newer_folder(tmp_path):
    from app.site_runtime.supernode import SuperNodeProcess  # noqa: PLC0415
    from app.tooling.certs import ensure_server_certificate, ensure_site_keys  # noqa: PLC0415
    from app.tooling.layout import DeployLayout  # noqa: PLC0415
    from app.tooling.superlink import SuperLinkProcess  # noqa: PLC0415

    layout = DeployLayout(tmp_path / "deploy")
    ensure_server_certificate(layout.certs, "127.0.0.1")
    ensure_site_keys(layout.certs, "hospital-a")
    newer = {sm.COORDINATOR: layout.superlink_dir, sm.SITE_STATE: tmp_path / "state"}
    for kind, folder in newer.items():
        folder.mkdir(parents=True)
        (folder / sm.FORMAT_FILE).write_text(json.dumps({"kind": kind, "version": 99}))
    data = tmp_path / "site"
    data.mkdir()
    (data / "table.csv").write_text("id,split,label\n")
    with pytest.raises(sm.StateFormatError, match="format version 99"):
        SuperLinkProcess.start_tls(layout)
    with pytest.raises(sm.StateFormatError, match="format version 99"):
        SuperNodeProcess.start(layout, "hospital-a", "127.0.0.1:1", data,
                               state_dir=newer[sm.SITE_STATE], policy=PERMISSIVE)
