"""A site folder for the console's tests, and a login with the console's admin token."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def site_folder(tmp_path: Path) -> tuple[Path, Path]:
    """``(state dir, policy file)`` under ``tmp_path``; the policy is configs/site-policy.toml."""
    state = tmp_path / "state"
    state.mkdir()
    policy = tmp_path / "policy.toml"
    shutil.copy(ROOT / "configs" / "site-policy.toml", policy)
    return state, policy


def csrf_of(html: str) -> str:
    """The hidden ``csrf`` field of a console page's form."""
    return re.search(r'name="csrf" value="([0-9a-f]+)"', html).group(1)


def log_in(client: httpx.Client, token_file: Path, origin: str) -> httpx.Client:
    """Log ``client`` in through the login form with the token in ``token_file`` (as a
    hospital admin does: read the file, type it in); returns ``client``."""
    form = client.get("/login")
    assert form.status_code == 200, form.text
    done = client.post("/login", data={"csrf": csrf_of(form.text), "next": "/",
                                       "token": token_file.read_text(encoding="utf-8").strip()},
                       headers={"Origin": origin}, follow_redirects=False)
    assert done.status_code == 303, done.text
    return client
