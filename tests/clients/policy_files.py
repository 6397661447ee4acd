"""Site policy files the tests write, and the refusal a bad one gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from clients.site.policy import SitePolicyError, load_policy


def write_policy(folder: Path, text: str, name: str = "policy.toml") -> Path:
    """Write ``text`` as the policy file ``folder / name`` and return its path."""
    path = folder / name
    path.write_text(text)
    return path


def policy_refusal(folder: Path, text: str, match: str) -> tuple[Path, SitePolicyError]:
    """Write the policy ``text`` and return its path and the error ``load_policy`` refuses it with.

    The error's message must match the regular expression ``match``.
    """
    path = write_policy(folder, text)
    with pytest.raises(SitePolicyError, match=match) as info:
        load_policy(path)
    return path, info.value
