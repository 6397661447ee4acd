"""The sites' PSI secret (clients/vertical/psi_secret.py) and ``make psi-secret`` (issue #46, found 4)."""

from __future__ import annotations

import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from app.tooling.psi_secret import main
from clients.site.policy import PolicyRefusal, SitePolicy, VerticalRules, load_policy
from clients.site.site import Site
from clients.vertical.psi import salted_items
from clients.vertical.psi_secret import SIMULATION_SECRET, site_secret
from tests.clients.policy_files import write_policy


def site_with(tmp_path: Path, policy: SitePolicy, name: str = "hospital-a") -> Site:
    return Site(name, tmp_path / "data" / name, tmp_path / "state" / name, policy)


def refusal(site: Site) -> PolicyRefusal:
    with pytest.raises(PolicyRefusal) as refused:
        site_secret(site)
    return refused.value


def test_a_policy_file_without_a_secret_refuses_the_psi(tmp_path):
    policy = load_policy(write_policy(tmp_path, "[vertical]\nallowed = true\n"))
    refused = refusal(site_with(tmp_path, policy))
    assert refused.rule == "vertical.psi-secret" and "names no PSI secret" in str(refused)
    assert not (tmp_path / "data" / SIMULATION_SECRET).exists()  # no fallback to simulation's


@pytest.mark.parametrize("content, match", [(None, "unreadable"), (b"x" * 15, "15 bytes")])
def test_an_unreadable_or_short_secret_is_refused(tmp_path, content, match):
    secret = tmp_path / "psi.secret"
    if content is not None:
        secret.write_bytes(content)
    policy = SitePolicy(vertical=VerticalRules(allowed=True, psi_secret=str(secret)))
    refused = refusal(site_with(tmp_path, policy))
    assert refused.rule == "vertical.psi-secret" and match in str(refused)
    assert str(secret) not in str(refused)  # the detail never names the path


def test_the_named_secret_keys_the_items(tmp_path):
    secret = tmp_path / "psi.secret"
    secret.write_bytes(b"k" * 16)
    site = site_with(tmp_path, SitePolicy(vertical=VerticalRules(psi_secret=str(secret))))
    assert site_secret(site) == b"k" * 16
    ids = ["patient-1", "patient-2"]
    assert salted_items(b"k" * 16, "fed", ids) != salted_items(b"j" * 16, "fed", ids)
    assert salted_items(b"k" * 16, "fed", ids) != salted_items(b"k" * 16, "fed-2", ids)


def test_simulated_sites_share_one_secret_made_once(tmp_path):
    sites = [site_with(tmp_path, SitePolicy.permissive(), f"hospital-{n}") for n in range(8)]
    with ThreadPoolExecutor(8) as pool:
        secrets_ = set(pool.map(site_secret, sites))
    path = tmp_path / "data" / SIMULATION_SECRET
    assert secrets_ == {path.read_bytes()} and len(path.read_bytes()) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_make_psi_secret_writes_once_and_never_overwrites(tmp_path, capsys):
    out = tmp_path / "keys" / "psi.secret"
    assert main(["--out", str(out)]) == 0
    first = out.read_bytes()
    assert len(first) == 32 and stat.S_IMODE(out.stat().st_mode) == 0o600
    assert main(["--out", str(out)]) == 0
    assert out.read_bytes() == first and "exists" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--out", "relative/psi.secret"])


def test_the_secret_the_runtime_hands_its_sandboxed_worker_is_used(tmp_path):
    """Under the runtime the worker runs as another user and cannot read the 0600 file: the
    runtime reads it and hands it over in memory (node_config policy-files)."""
    secret = tmp_path / "psi.secret"
    policy = load_policy(write_policy(tmp_path, f'[vertical]\nallowed = true\n'
                                                f'psi-secret = "{secret}"\n'))
    site = site_with(tmp_path, policy)
    assert refusal(site).rule == "vertical.psi-secret"  # not on this disk
    handed = Site(site.name, site.data_path, site.state_dir, policy,
                  policy_files=((str(secret), b"s" * 32),))
    assert site_secret(handed) == b"s" * 32
