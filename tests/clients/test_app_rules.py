"""The site policy's [apps] section: loading and eager validation (file and key named)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from clients.site.app_rules import AppApprovalError, AppRules, parse_app_rules
from clients.site.policy import SitePolicy, SitePolicyError, load_policy
from tests.clients.policy_files import policy_refusal, write_policy

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
DIGEST = "3fa2c1d0e9b7" + "0" * 52


def _public_pem(path: Path, key) -> Path:
    path.write_bytes(key.public_key().public_bytes(Encoding.PEM,
                                                   PublicFormat.SubjectPublicKeyInfo))
    return path


def _with_apps(apps: str) -> str:
    """A policy whose [apps] section holds ``apps``."""
    return f"min-batch-size = 4\n[apps]\n{apps}\n"


def _write(tmp_path: Path, apps: str) -> Path:
    return write_policy(tmp_path, _with_apps(apps))


def test_shipped_policies_default_deny_and_permissive():
    assert load_policy(CONFIGS / "site-policy.toml").apps == AppRules(any=False)
    assert load_policy(CONFIGS / "site-policy-permissive.toml").apps == AppRules(any=True)
    assert SitePolicy.permissive().apps.any


def test_a_valid_section_is_kept_and_fingerprinted(tmp_path):
    key = _public_pem(tmp_path / "coordinator.pub", Ed25519PrivateKey.generate())
    approved = tmp_path / "approved.txt"
    approved.write_text(f"# approvals\n{DIGEST}  # approved 2026-11-23\n\n")
    policy = load_policy(_write(tmp_path, f'any = false\napproved-sha256 = ["{DIGEST}"]\n'
                                          f'approved-file = "{approved}"\n'
                                          f'trusted-keys = ["{key}"]'))
    assert policy.apps == AppRules(any=False, approved_sha256=(DIGEST,),
                                   approved_file=str(approved), trusted_keys=(str(key),))
    without = load_policy(_write(tmp_path, "any = false"))
    assert policy.fingerprint != without.fingerprint


def test_a_policy_file_without_an_apps_section_approves_no_app(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text("min-batch-size = 4\n")
    assert load_policy(path).apps == AppRules(any=False)
    assert load_policy(_write(tmp_path, f'approved-sha256 = ["{DIGEST}"]')).apps.any is False


def test_a_missing_approved_file_approves_nothing_yet(tmp_path):
    absent = tmp_path / "not-yet.txt"
    policy = load_policy(_write(tmp_path, f'any = false\napproved-file = "{absent}"'))
    assert policy.apps.approved_file == str(absent)


@pytest.mark.parametrize("apps, key", [
    ("anything = true", "'apps.anything' is an unknown key"),
    ('any = "no"', "'apps.any' must be true or false"),
    (f'any = false\napproved-sha256 = ["{DIGEST.upper()}"]', "'apps.approved-sha256' entries"),
    ('any = false\napproved-sha256 = ["3fa2c1"]', "'apps.approved-sha256' entries"),
    (f'any = false\napproved-sha256 = "{DIGEST}"', "'apps.approved-sha256' must be a list"),
    ('any = false\napproved-file = "approved.txt"', "'apps.approved-file' must be an absolute"),
    ('any = false\ntrusted-keys = ["keys/a.pub"]', "'apps.trusted-keys' entry must be an abs"),
    ('any = false\ntrusted-keys = ["/nonexistent/a.pub"]', "'apps.trusted-keys': public key "
                                                          "/nonexistent/a.pub: unreadable"),
    (f'any = true\napproved-sha256 = ["{DIGEST}"]', "'apps.any' is true but the section"),
])
def test_bad_apps_values_are_refused_naming_the_key(tmp_path, apps, key):
    path, error = policy_refusal(tmp_path, _with_apps(apps), key)
    assert str(path) in str(error)


def test_key_files_must_be_ed25519_public_keys_naming_the_file(tmp_path):
    garbage = tmp_path / "garbage.pub"
    garbage.write_text("not a key")
    ecdsa = _public_pem(tmp_path / "ecdsa.pub", ec.generate_private_key(ec.SECP256R1()))
    for path, reason in ((garbage, "not a PEM public key"), (ecdsa, "not an Ed25519 key")):
        with pytest.raises(SitePolicyError, match=f"public key {path}: {reason}"):
            load_policy(_write(tmp_path, f'any = false\ntrusted-keys = ["{path}"]'))


def test_a_malformed_approved_file_names_file_and_line(tmp_path):
    approved = tmp_path / "approved.txt"
    approved.write_text(f"{DIGEST}\nhospital-b's app\n")
    with pytest.raises(SitePolicyError, match=f"approved-file {approved}: line 2 is not"):
        load_policy(_write(tmp_path, f'any = false\napproved-file = "{approved}"'))


def test_apps_must_be_a_table(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text("apps = true\n")
    with pytest.raises(SitePolicyError, match="'apps' must be a table"):
        load_policy(path)


def test_revocation_lists_are_parsed_and_checked(tmp_path):
    digest = "ab" * 32
    rules = parse_app_rules({"any": True, "revoked-sha256": [digest],
                             "revoked-keys": ["0123456789ab"]}, "p.toml")
    assert rules.any and rules.revoked_sha256 == (digest,)
    assert rules.revoked_keys == ("0123456789ab",)
    with pytest.raises(AppApprovalError, match="'apps.revoked-sha256'.*64 lowercase hex"):
        parse_app_rules({"revoked-sha256": ["AB" * 32]}, "p.toml")
    with pytest.raises(AppApprovalError, match="'apps.revoked-keys'.*12 lowercase hex"):
        parse_app_rules({"revoked-keys": ["not-a-fingerprint"]}, "p.toml")
