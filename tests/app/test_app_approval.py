"""Approved apps only: the FAB check of the site runner, signing keys and the approve tool."""

from __future__ import annotations

import base64
import pickle
import stat
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import pytest
from flwr.common.config import parse_config_args

from app.config.run_config import RunConfig, RunConfigError
from app.tooling import deployment
from app.site_runtime.audit_log import AuditLog
from app.site_runtime.app_approval import (SIGNATURE_KEY, AppNotApproved, approve, check_app,
                                        fab_sha256, keygen, main, project_fab, sign_app)
from app.tooling.run_submission import RunOutcome
from clients.site.app_rules import AppApprovalError, AppRules, key_fingerprint, load_public_key
from clients.site.policy import SitePolicyError
from strategies.rounds.checkpoint import config_difference
from strategies.wire.errors import SiteError
from tests.app.tiny_app import write_tiny_app

FAB = b"PK\x03\x04 a stand-in app bundle: check_app only hashes and compares bytes"
DIGEST = fab_sha256(FAB)


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    return keygen(tmp_path / "keys")


def _trusting(*public: Path) -> AppRules:
    return AppRules(any=False, trusted_keys=tuple(str(p) for p in public))


def _policy(tmp_path: Path, apps: str) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(f"[apps]\n{apps}\n")
    return path


def test_keygen_sign_check_round_trip(keys):
    private, public = keys
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    signature = sign_app(DIGEST, private)
    how = check_app(_trusting(public), DIGEST, FAB, signature)
    assert how == f"key {key_fingerprint(load_public_key(public))}"
    with pytest.raises(AppApprovalError, match="refusing to overwrite"):
        keygen(private.parent)


def test_one_changed_byte_is_refused_whether_or_not_its_hash_is_updated(keys):
    private, public = keys
    signature = sign_app(DIGEST, private)
    changed = bytes([FAB[0] ^ 1]) + FAB[1:]
    with pytest.raises(AppNotApproved, match="bundle does not match its hash"):
        check_app(_trusting(public), DIGEST, changed, signature)
    with pytest.raises(AppNotApproved, match="no signature from a trusted key"):
        check_app(_trusting(public), fab_sha256(changed), changed, signature)


def test_untrusted_key_and_signature_of_another_hash_are_refused(tmp_path, keys):
    private, public = keys
    other_private, _ = keygen(tmp_path / "other")
    with pytest.raises(AppNotApproved, match="no signature from a trusted key"):
        check_app(_trusting(public), DIGEST, FAB, sign_app(DIGEST, other_private))
    with pytest.raises(AppNotApproved, match="no signature from a trusted key"):
        check_app(_trusting(public), DIGEST, FAB, sign_app(fab_sha256(b"other"), private))
    for bad in ("", "not base64!", base64.b64encode(b"short").decode()):
        with pytest.raises(AppNotApproved, match="no signature from a trusted key"):
            check_app(_trusting(public), DIGEST, FAB, bad)


def test_refusal_names_the_rule_and_short_hash_never_a_path(tmp_path, keys):
    rules = AppRules(any=False, approved_file=str(tmp_path / "approved.txt"),
                     trusted_keys=(str(keys[1]),))
    with pytest.raises(AppNotApproved) as info:
        check_app(rules, DIGEST, FAB, "")
    text = str(info.value)
    assert text.startswith(f"app {DIGEST[:12]} is not approved by this site (policy [apps]: ")
    assert "not in approved-sha256 or approved-file" in text and "/" not in text
    assert isinstance(info.value, SiteError) and info.value.rule == "apps"
    copy = pickle.loads(pickle.dumps(info.value))
    assert (str(copy), copy.rule) == (text, "apps")


def test_a_malformed_approved_file_refuses_without_naming_it(tmp_path):
    approved = tmp_path / "approved.txt"
    approved.write_text(f"{DIGEST[:-1]}\n")
    with pytest.raises(AppNotApproved, match="approved-file unreadable or malformed") as info:
        check_app(AppRules(any=False, approved_file=str(approved)), DIGEST, FAB, "")
    assert "/" not in str(info.value)


def test_any_and_listed_digest_approve(tmp_path):
    assert check_app(AppRules(), DIGEST, FAB, "") == "any"
    assert check_app(AppRules(any=False, approved_sha256=(DIGEST,)), DIGEST, FAB, "") == "sha256"
    with pytest.raises(AppNotApproved, match="bundle does not match"):
        check_app(AppRules(), DIGEST, FAB + b"x", "")


def test_approve_appends_once_and_is_reread_without_restart(tmp_path):
    approved = tmp_path / "approved.txt"
    policy = _policy(tmp_path, f'any = false\napproved-file = "{approved}"')
    before = policy.read_bytes()
    rules = AppRules(any=False, approved_file=str(approved))
    with pytest.raises(AppNotApproved):
        check_app(rules, DIGEST, FAB, "")
    approved.write_text("# hospital A's approvals\n\n" + "0" * 64 + "  # an older app")
    assert approve(policy, DIGEST) is True
    assert approve(policy, DIGEST) is False
    assert check_app(rules, DIGEST, FAB, "") == "sha256"
    lines = approved.read_text().splitlines()
    assert [line.split()[0] for line in lines if line and not line.startswith("#")] == [
        "0" * 64, DIGEST]
    assert lines[-1].startswith(f"{DIGEST}  # approved ") and policy.read_bytes() == before


def test_approve_needs_an_approved_file_and_a_digest(tmp_path):
    policy = _policy(tmp_path, "any = false")
    with pytest.raises(SitePolicyError, match='add approved-file = "/abs/'):
        approve(policy, DIGEST)
    with pytest.raises(AppApprovalError, match="64 lowercase hex"):
        approve(policy, DIGEST.upper())


def test_command_line_hash_approve_and_keygen(tmp_path, capsys):
    fab = tmp_path / "app.fab"
    fab.write_bytes(FAB)
    approved = tmp_path / "approved.txt"
    policy = _policy(tmp_path, f'any = false\napproved-file = "{approved}"')
    assert main(["hash", "--fab", str(fab)]) == 0
    assert capsys.readouterr().out.strip() == DIGEST
    state = tmp_path / "state"
    assert main(["approve", "--policy", str(policy), "--fab", str(fab), "--state", str(state)]) == 0
    assert DIGEST in approved.read_text()
    assert [(r["kind"], r["app"], r["by"]) for r in AuditLog(state).records()] == [
        ("app-approved", DIGEST, "cli")]
    assert main(["keygen", "--out", str(tmp_path / "k")]) == 0
    assert main(["keygen", "--out", str(tmp_path / "k")]) == 1
    assert "refusing to overwrite" in capsys.readouterr().err


def test_project_fab_is_what_flwr_run_builds_and_deterministic(tmp_path, capsys):
    project = write_tiny_app(tmp_path / "tiny", "app = None\n")
    first = project_fab(project)
    assert project_fab(project) == first
    assert main(["hash", "--app", str(project)]) == 0
    assert capsys.readouterr().out.strip() == fab_sha256(first)
    with pytest.raises(AppApprovalError, match="no Flower app bundle"):
        project_fab(tmp_path / "absent")


def test_federate_sign_key_sends_a_signature_the_site_accepts(tmp_path, keys, monkeypatch):
    private, public = keys
    sent: list[str] = []
    monkeypatch.setattr(deployment, "project_fab", lambda project: FAB)
    monkeypatch.setattr(deployment, "_connected_layout", lambda args: None)
    monkeypatch.setattr(deployment, "submit_run",
                        lambda home, run_config, *a, **k: sent.append(run_config)
                        or RunOutcome(None, "not-started"))
    assert deployment.main(["federate", "--tracking-uri", "http://127.0.0.1:1",
                            "--artifact-root", str(tmp_path), "--sign-key", str(private),
                            "--allow-no-roster"]) == 1
    signature = parse_config_args(sent)[SIGNATURE_KEY]
    assert check_app(_trusting(public), DIGEST, FAB, signature).startswith("key ")


def test_run_config_carries_the_signature_but_no_setting():
    config = RunConfig.from_mapping({SIGNATURE_KEY: "c2ln", "local-steps": 3})
    assert SIGNATURE_KEY not in config.as_params() and config == RunConfig(local_steps=3)
    assert config_difference(RunConfig().as_params(), config.as_params()) == [
        "local-steps: 200 -> 3"]
    with pytest.raises(RunConfigError, match=f"'{SIGNATURE_KEY}' must be str"):
        RunConfig.from_mapping({SIGNATURE_KEY: 1})


def _v1_signature(private: Path, digest: str) -> str:
    """A signature in the format before expiry dates: the digest alone, signed."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    key = load_pem_private_key(private.read_bytes(), password=None)
    return base64.b64encode(key.sign(b"fedmed-app-approval-v1\n" + digest.encode())).decode()


def test_a_signature_carries_an_expiry_and_an_expired_or_old_one_is_refused(keys):
    private, public = keys
    today = datetime.now(timezone.utc).date()  # signatures expire by the UTC date
    signature = sign_app(DIGEST, private)
    assert signature.startswith(f"{today + timedelta(days=90):%Y-%m-%d}:")  # default 90 days
    last_day = sign_app(DIGEST, private, expires=today)
    assert check_app(_trusting(public), DIGEST, FAB, last_day).startswith("key ")
    with pytest.raises(AppNotApproved, match=r"signature expired on \d{4}-\d\d-\d\d"):
        check_app(_trusting(public), DIGEST, FAB, sign_app(DIGEST, private,
                                                           expires=today - timedelta(days=1)))
    with pytest.raises(AppNotApproved, match="old-format signature without an expiry"):
        check_app(_trusting(public), DIGEST, FAB, _v1_signature(private, DIGEST))
    moved = signature.replace(signature[:10], f"{today + timedelta(days=900):%Y-%m-%d}")
    with pytest.raises(AppNotApproved, match="no signature from a trusted key"):
        check_app(_trusting(public), DIGEST, FAB, moved)  # the date is signed too


def test_revocation_wins_over_any_approval(tmp_path, keys):
    private, public = keys
    signature = sign_app(DIGEST, private)
    fingerprint = key_fingerprint(load_public_key(public))
    revoked = AppRules(any=True, revoked_sha256=(DIGEST,))
    with pytest.raises(AppNotApproved, match="revoked-sha256"):
        check_app(revoked, DIGEST, FAB, "")
    for rules in (AppRules(any=False, approved_sha256=(DIGEST,), revoked_sha256=(DIGEST,)),
                  AppRules(any=False, trusted_keys=(str(public),), revoked_sha256=(DIGEST,))):
        with pytest.raises(AppNotApproved, match="revoked-sha256"):
            check_app(rules, DIGEST, FAB, signature)
    by_key = AppRules(any=False, trusted_keys=(str(public),), revoked_keys=(fingerprint,))
    with pytest.raises(AppNotApproved, match=f"revoked-keys.*{fingerprint}"):
        check_app(by_key, DIGEST, FAB, signature)
    assert check_app(AppRules(any=False, approved_sha256=(DIGEST,), revoked_keys=(fingerprint,)),
                     DIGEST, FAB, "") == "sha256"  # a revoked key does not revoke a digest


def test_command_line_sign_with_an_expiry(tmp_path, keys, capsys):
    private, public = keys
    project = write_tiny_app(tmp_path / "tiny", "app = None\n")
    assert main(["sign", "--key", str(private), "--app", str(project),
                 "--expires", "2031-01-31"]) == 0
    out = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert out["expires"] == "2031-01-31" and out["signature"].startswith("2031-01-31:")
    digest = fab_sha256(project_fab(project))
    assert check_app(_trusting(public), digest, project_fab(project), out["signature"],
                     today=date(2031, 1, 31)).startswith("key ")
    with pytest.raises(SystemExit):
        main(["sign", "--key", str(private), "--expires", "31/01/2031"])


def test_signing_with_an_expiry_in_the_past_is_refused(tmp_path, keys, capsys):
    """Issue 47, walkthrough 6: it signed without a warning; every site refused it."""
    private, _ = keys
    project = write_tiny_app(tmp_path / "tiny", "app = None\n")
    assert main(["sign", "--key", str(private), "--app", str(project),
                 "--expires", "2020-01-31"]) == 1
    captured = capsys.readouterr()
    assert "--expires 2020-01-31 is in the past" in captured.err and not captured.out
