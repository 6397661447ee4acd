"""The app bundle is Flower's, byte for byte, built without walking the virtual environment.

Found: every ``flwr run`` (and ``make sign-app``) bundled the checkout with
Flower's builder, which lists all ~60,000 files under it, .venv included,
before filtering: 15 s of CPU, up to a minute of wall time on loaded cores.
"""

from __future__ import annotations

import os
import time

import pytest
from flwr.cli.build import build_fab_from_disk

from app.site_runtime import app_bundle
from app.site_runtime.app_bundle import build_project_fab, project_files, staged_project
from tests.app.tiny_app import write_tiny_app


@pytest.fixture
def project(tmp_path):
    folder = write_tiny_app(tmp_path / "tinyapp", "app = None\n")
    (folder / ".gitignore").write_text("data/\nmlruns/\n")
    (folder / "docs").mkdir()
    (folder / "docs" / "guide.md").write_text("# guide\n")
    for dropped in (".venv/lib/site.py", ".flwr/apps/old.py", "data/site/scan.py",
                    "mlruns/0/meta.json", "pkg/__pycache__/m.py"):
        (folder / dropped).parent.mkdir(parents=True, exist_ok=True)
        (folder / dropped).write_text("x = 1\n")
    (folder / "pkg" / "module.py").write_text("y = 2\n")
    os.symlink(folder / "pkg" / "module.py", folder / "link.py")
    return folder


def test_the_bundle_is_flowers_and_the_dropped_folders_are_not_walked(project, monkeypatch):
    walked = []
    real_walk = os.walk
    monkeypatch.setattr(app_bundle.os, "walk", lambda *a, **k: (
        walked.append(step[0]) or step for step in real_walk(*a, **k)))
    files = project_files(project)
    assert "pkg/module.py" in files and "docs/guide.md" in files and "link.py" not in files
    assert not any(p.startswith((".venv/", ".flwr/", "data/", "mlruns/")) for p in files)
    assert not any(part in w for w in walked for part in (".venv", "mlruns", "__pycache__"))
    assert build_project_fab(project) == build_fab_from_disk(project)


def test_a_gitignore_re_include_makes_it_walk_everything(project):
    (project / ".gitignore").write_text("data/*\n!data/site/\n")
    assert "data/site/scan.py" in project_files(project)
    assert build_project_fab(project) == build_fab_from_disk(project)


def test_the_staged_folder_rebuilds_the_same_bundle_and_is_reused(project, tmp_path):
    staging = tmp_path / "staged"
    first = staged_project(project, staging)
    assert build_fab_from_disk(first) == build_project_fab(project)
    assert staged_project(project, staging) == first
    (project / "pkg" / "module.py").write_text("y = 3\n")
    second = staged_project(project, staging)
    assert second != first and sorted(p.name for p in staging.iterdir()) == sorted(
        [first.name, second.name])
    # A staged bundle unused for a day is removed when another one is staged;
    # a folder the product did not make is never touched.
    (staging / "notes").mkdir()
    old = time.time() - app_bundle.STALE_AFTER_S - 60
    os.utime(first, (old, old))
    staged_project(project, staging)
    assert sorted(p.name for p in staging.iterdir()) == sorted([second.name, "notes"])
