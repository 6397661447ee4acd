"""The install check of a warm message: an unchanged install is vouched for by its stat
signature (no file read, no re-install), and every kind of edit still makes it compare the
bytes and install the bundle afresh."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from app.site_runtime import installed_app
from app.site_runtime.app_approval import project_fab
from app.site_runtime.installed_app import install_signature, verified_install
from tests.app.tiny_app import write_tiny_app

CLIENT = "from flwr.clientapp import ClientApp\napp = ClientApp()\n"
HELPER = "VALUE = 1\n"


class _Reads:
    """Counts the install folder's files read and Flower's install calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, apps: Path) -> None:
        self.files: list[str] = []
        self.installs = 0
        read_bytes = Path.read_bytes
        install = installed_app.install_from_fab

        def counted_read(path: Path) -> bytes:
            if path.is_relative_to(apps):
                self.files.append(path.name)
            return read_bytes(path)

        def counted_install(*args, **kwargs) -> Path:
            self.installs += 1
            return install(*args, **kwargs)

        monkeypatch.setattr(Path, "read_bytes", counted_read)
        monkeypatch.setattr(installed_app, "install_from_fab", counted_install)

    def clear(self) -> None:
        self.files.clear()
        self.installs = 0


@pytest.fixture
def fab(tmp_path, monkeypatch) -> bytes:
    """A bundle of three files (one in a subfolder), installed under a fresh FLWR_HOME."""
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))
    project = write_tiny_app(tmp_path / "tiny", CLIENT)
    (project / "helpers").mkdir()
    (project / "helpers" / "values.py").write_text(HELPER)
    return project_fab(project)


@pytest.fixture
def reads(tmp_path, monkeypatch) -> _Reads:
    return _Reads(monkeypatch, tmp_path / "flwr-home" / "apps")


def test_an_unchanged_install_is_not_read_again(fab, reads, monkeypatch):
    monkeypatch.setattr(installed_app, "RACY_NS", 0)  # as if installed long ago
    folder, differences = verified_install(fab)
    assert differences == [] and reads.installs == 1
    assert sorted(reads.files) == ["pyproject.toml", "tinyapp_client.py", "values.py"]
    reads.clear()
    for _ in range(3):
        assert verified_install(fab) == (folder, [])
    assert reads.files == [] and reads.installs == 0


def test_a_just_changed_install_is_compared_again(fab, reads):
    """Its files' times are within a clock tick of the signature: it cannot vouch for them."""
    folder, _ = verified_install(fab)
    reads.clear()
    assert verified_install(fab) == (folder, [])
    assert sorted(reads.files) == ["pyproject.toml", "tinyapp_client.py", "values.py"]
    # so an in-place edit of the same size, its mtime put back, is still found
    client = folder / "tinyapp_client.py"
    before = client.stat()
    client.write_text(CLIENT.replace("app = ", "ap_ = "))
    os.utime(client, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert verified_install(fab)[1] == ["tinyapp_client.py"]
    assert client.read_text() == CLIENT


def _edit_in_place(folder: Path) -> None:
    """Same size, mtime put back: only the ctime tells (a later clock tick than the install)."""
    client = folder / "tinyapp_client.py"
    before = client.stat()
    time.sleep(0.05)
    client.write_text(CLIENT.replace("app = ", "ap_ = "))
    os.utime(client, ns=(before.st_atime_ns, before.st_mtime_ns))


def _replace(folder: Path) -> None:
    """A new file of the same size renamed over the old one (a new inode)."""
    (folder / "helpers" / "new.py").write_text("VALUE = 2\n")
    os.replace(folder / "helpers" / "new.py", folder / "helpers" / "values.py")


EDITS = {
    "grown": (lambda f: (f / "tinyapp_client.py").write_text(CLIENT + "import os\n"),
              ["tinyapp_client.py"]),
    "in-place": (_edit_in_place, ["tinyapp_client.py"]),
    "replaced": (_replace, ["helpers/values.py"]),
    "added": (lambda f: (f / "helpers" / "extra.py").write_text("print('x')\n"),
              ["helpers/extra.py"]),
    "byte-code": (lambda f: (f / "helpers" / "values.pyc").write_bytes(b"\0"),
                  ["helpers/values.pyc"]),
    "removed": (lambda f: (f / "helpers" / "values.py").unlink(), ["helpers/values.py"]),
    "linked": (lambda f: (f / "helpers" / "os.py").symlink_to("/etc/hostname"),
               ["helpers/os.py"]),
    "linked-folder": (lambda f: (f / "site").symlink_to("/etc", target_is_directory=True),
                      ["site"]),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_edit_after_the_install_was_vouched_for_is_found_and_reinstalled(
        edit, fab, reads, monkeypatch):
    monkeypatch.setattr(installed_app, "RACY_NS", 0)
    folder, _ = verified_install(fab)
    signature = install_signature(folder)
    change, expected = EDITS[edit]
    change(folder)
    assert install_signature(folder) != signature
    reads.clear()
    assert verified_install(fab) == (folder, expected)
    assert reads.installs == 2  # the folder as it was, then afresh
    assert (folder / "tinyapp_client.py").read_text() == CLIENT
    assert (folder / "helpers" / "values.py").read_text() == HELPER
    assert sorted(os.listdir(folder / "helpers")) == ["values.py"]
    assert not (folder / "site").exists()
    reads.clear()
    assert verified_install(fab) == (folder, [])  # the fresh install is vouched for again
    assert reads.files == [] and reads.installs == 0


def test_a_deleted_install_is_installed_again(fab, monkeypatch):
    monkeypatch.setattr(installed_app, "RACY_NS", 0)
    folder, _ = verified_install(fab)
    for path in sorted(folder.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    folder.rmdir()
    assert verified_install(fab) == (folder, [])
    assert (folder / "helpers" / "values.py").read_text() == HELPER


def test_another_flower_home_gets_its_own_install(fab, tmp_path, monkeypatch):
    monkeypatch.setattr(installed_app, "RACY_NS", 0)
    first, _ = verified_install(fab)
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "other-home"))
    second, _ = verified_install(fab)
    assert second != first and second.is_relative_to(tmp_path / "other-home")
    assert (second / "tinyapp_client.py").read_text() == CLIENT
