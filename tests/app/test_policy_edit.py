"""Approve / revoke from the console: the policy text edited in place, atomically, audited."""

from __future__ import annotations

import hashlib
import os
import tomllib
from pathlib import Path

import pytest

from app.site_runtime.app_approval import AppNotApproved, check_app, keygen, sign_app
from app.site_runtime.audit_chain import verify_chain
from app.site_runtime.audit_log import AuditLog
from app.site_runtime.policy_edit import (AuditNotWritten, apply_edit, last_revoke, plan_edit,
                                          set_apps_list)
from clients.site.policy import load_policy
from strategies.wire.errors import ConfigError
from tests.app.console_site import site_folder

FAB = b"a tiny app bundle"
DIGEST = hashlib.sha256(FAB).hexdigest()
OTHER = "d" * 64


@pytest.fixture
def site(tmp_path: Path) -> dict[str, Path]:
    state, policy = site_folder(tmp_path)
    policy.chmod(0o640)
    return {"state": state, "policy": policy}


def kinds(state: Path) -> list[str]:
    return [record["kind"] for record in AuditLog(state).records()]


def test_set_apps_list_changes_only_that_key_and_keeps_comments():
    text = ('# the hospital\'s note\nmin-batch-size = 4\n\n[apps]\n# who may run\nany = false\n'
            'approved-sha256 = []   # filled by the console\nrevoked-sha256 = [\n    "'
            + OTHER + '",\n]\n\n[dp]\nrequired = false\n')
    edited = set_apps_list(text, "approved-sha256", [DIGEST])
    assert f'approved-sha256 = ["{DIGEST}"]  # filled by the console' in edited
    assert "# the hospital's note" in edited and "# who may run" in edited
    assert tomllib.loads(edited)["apps"]["revoked-sha256"] == [OTHER]
    edited = set_apps_list(edited, "revoked-sha256", [OTHER, DIGEST])
    table = tomllib.loads(edited)
    assert table["apps"]["revoked-sha256"] == [OTHER, DIGEST]
    assert table["dp"] == {"required": False}
    assert set(edited.splitlines()) - set(text.splitlines()) <= {
        f'approved-sha256 = ["{DIGEST}"]  # filled by the console', f'    "{DIGEST}",'}


def test_set_apps_list_inserts_a_missing_key_and_a_missing_table():
    edited = set_apps_list("[apps]\nany = false\n\n# trailing note\n[dp]\nrequired = true\n",
                           "revoked-sha256", [OTHER])
    assert edited.splitlines()[:3] == ["[apps]", "any = false", f'revoked-sha256 = ["{OTHER}"]']
    assert tomllib.loads(edited)["dp"] == {"required": True}
    edited = set_apps_list("min-batch-size = 4\n", "approved-sha256", [DIGEST])
    assert tomllib.loads(edited) == {"min-batch-size": 4, "apps": {"approved-sha256": [DIGEST]}}


def test_set_apps_list_refuses_an_inline_apps_table():
    with pytest.raises(ConfigError, match="not written as an \\[apps\\] table"):
        set_apps_list('apps = { any = false }\n', "approved-sha256", [DIGEST])


def test_approve_by_digest_makes_the_app_run_and_is_audited(site):
    rules = load_policy(site["policy"]).apps
    with pytest.raises(AppNotApproved):
        check_app(rules, DIGEST, FAB, "")
    plan = plan_edit(site["policy"], "approve", DIGEST)
    assert plan.changes == (f"apps.approved-sha256: add {DIGEST}",)
    assert plan.before != plan.after
    edit = apply_edit(site["policy"], site["state"], "approve", DIGEST, "ethics ok")
    policy = load_policy(site["policy"])
    assert policy.fingerprint == edit.after
    assert check_app(policy.apps, DIGEST, FAB, "") == "sha256"
    assert "# Which app bundles (FABs) this site runs" in site["policy"].read_text()
    assert site["policy"].stat().st_mode & 0o777 == 0o640
    records = list(AuditLog(site["state"]).records())
    assert [(r["kind"], r.get("app"), r["by"]) for r in records] == [
        ("app-approved", DIGEST, "console"), ("policy-change", None, "console")]
    assert records[0]["reason"] == "ethics ok" and records[1]["fingerprint"] == edit.after
    assert records[0]["changes"] == f"apps.approved-sha256: add {DIGEST}"
    assert verify_chain(site["state"]).ok


def test_revoke_makes_the_next_check_refuse_the_app(site):
    apply_edit(site["policy"], site["state"], "approve", DIGEST, "")
    edit = apply_edit(site["policy"], site["state"], "revoke", DIGEST, "vendor recall")
    assert set(edit.changes) == {f"apps.revoked-sha256: add {DIGEST}",
                                 f"apps.approved-sha256: remove {DIGEST}"}
    rules = load_policy(site["policy"]).apps
    assert DIGEST in rules.revoked_sha256 and DIGEST not in rules.approved_sha256
    with pytest.raises(AppNotApproved, match="revoked-sha256"):
        check_app(rules, DIGEST, FAB, "")
    assert kinds(site["state"])[-2:] == ["app-revoked", "policy-change"]


def test_approving_a_revoked_app_lifts_the_revocation(site):
    apply_edit(site["policy"], site["state"], "revoke", DIGEST, "")
    edit = apply_edit(site["policy"], site["state"], "approve", DIGEST, "fixed")
    assert set(edit.changes) == {f"apps.revoked-sha256: remove {DIGEST}",
                                 f"apps.approved-sha256: add {DIGEST}"}
    assert check_app(load_policy(site["policy"]).apps, DIGEST, FAB, "") == "sha256"


def test_undo_revoke_restores_a_digest_approval_the_revoke_took_out(site):
    apply_edit(site["policy"], site["state"], "approve", DIGEST, "")
    apply_edit(site["policy"], site["state"], "revoke", DIGEST, "recall", by="console admin x")
    seq = last_revoke(site["state"], DIGEST)["seq"]
    edit = apply_edit(site["policy"], site["state"], "undo-revoke", DIGEST, "wrong app",
                      by="console admin y")
    assert edit.changes == (f"apps.revoked-sha256: remove {DIGEST}",
                            f"apps.approved-sha256: add {DIGEST} (back, as before the revoke)")
    assert check_app(load_policy(site["policy"]).apps, DIGEST, FAB, "") == "sha256"
    undone = [r for r in AuditLog(site["state"]).records() if r["kind"] == "app-revoke-undone"]
    assert [(r["undoes"], r["by"], r["reason"]) for r in undone] == [
        (seq, "console admin y", "wrong app")]
    assert last_revoke(site["state"], DIGEST) is None
    assert plan_edit(site["policy"], "undo-revoke", DIGEST, site["state"]).changes == ()


def test_undo_revoke_of_a_signed_app_adds_no_digest_approval(site, tmp_path):
    private, public = keygen(tmp_path / "keys")
    site["policy"].write_text(site["policy"].read_text().replace(
        "trusted-keys = []", f'trusted-keys = ["{public}"]'))
    signature = sign_app(DIGEST, private)
    assert check_app(load_policy(site["policy"]).apps, DIGEST, FAB, signature).startswith("key ")
    before = site["policy"].read_text()
    apply_edit(site["policy"], site["state"], "revoke", DIGEST, "")
    edit = apply_edit(site["policy"], site["state"], "undo-revoke", DIGEST, "")
    assert edit.changes == (f"apps.revoked-sha256: remove {DIGEST}",)
    assert site["policy"].read_text() == before  # exactly the policy before the revoke
    rules = load_policy(site["policy"]).apps
    assert DIGEST not in rules.approved_sha256
    assert check_app(rules, DIGEST, FAB, signature).startswith("key ")
    with pytest.raises(AppNotApproved):  # still only by the signature, until it expires
        check_app(rules, DIGEST, FAB, "")


def test_approve_appends_to_the_approved_file_when_the_policy_names_one(site, tmp_path):
    approved_file = tmp_path / "approved-apps.txt"
    text = site["policy"].read_text().replace('approved-file = ""',
                                              f'approved-file = "{approved_file}"')
    site["policy"].write_text(text)
    before = load_policy(site["policy"]).fingerprint
    edit = apply_edit(site["policy"], site["state"], "approve", DIGEST, "")
    assert edit.changes == (f"approved-file {approved_file}: append {DIGEST}",)
    assert site["policy"].read_text() == text  # the policy file itself is untouched
    assert approved_file.read_text().startswith(f"{DIGEST}  # approved ")
    assert edit.after == before and kinds(site["state"]) == ["app-approved"]
    assert check_app(load_policy(site["policy"]).apps, DIGEST, FAB, "") == "sha256"


def test_nothing_to_change_writes_nothing(site):
    apply_edit(site["policy"], site["state"], "revoke", DIGEST, "")
    text, count = site["policy"].read_text(), len(kinds(site["state"]))
    edit = apply_edit(site["policy"], site["state"], "revoke", DIGEST, "")
    assert edit.changes == () and site["policy"].read_text() == text
    assert len(kinds(site["state"])) == count


def test_a_policy_changed_since_the_confirmation_is_not_edited(site):
    plan = plan_edit(site["policy"], "revoke", DIGEST)
    site["policy"].write_text(site["policy"].read_text().replace("min-batch-size = 4",
                                                                 "min-batch-size = 8"))
    with pytest.raises(ConfigError, match="changed since the confirmation"):
        apply_edit(site["policy"], site["state"], "revoke", DIGEST, "", plan.before)
    assert DIGEST not in load_policy(site["policy"]).apps.revoked_sha256
    assert kinds(site["state"]) == []


def test_under_any_true_approve_only_lifts_a_revocation(site):
    site["policy"].write_text(site["policy"].read_text().replace("any = false", "any = true"))
    assert plan_edit(site["policy"], "approve", DIGEST).changes == ()
    apply_edit(site["policy"], site["state"], "revoke", DIGEST, "")
    with pytest.raises(AppNotApproved):
        check_app(load_policy(site["policy"]).apps, DIGEST, FAB, "")
    edit = apply_edit(site["policy"], site["state"], "approve", DIGEST, "")
    assert edit.changes == (f"apps.revoked-sha256: remove {DIGEST}",)
    assert check_app(load_policy(site["policy"]).apps, DIGEST, FAB, "") == "any"


@pytest.mark.parametrize("action, digest", [("delete", DIGEST), ("approve", "ABC"),
                                            ("revoke", DIGEST.upper())])
def test_bad_requests_are_refused(site, action, digest):
    with pytest.raises(ConfigError):
        plan_edit(site["policy"], action, digest)


def test_an_invalid_result_is_never_written(site, monkeypatch):
    text = site["policy"].read_text()
    monkeypatch.setattr("app.site_runtime.policy_edit.load_policy",
                        _failing_on_temp_files(load_policy))
    with pytest.raises(ConfigError, match="would make the policy invalid"):
        apply_edit(site["policy"], site["state"], "revoke", DIGEST, "")
    assert site["policy"].read_text() == text
    assert sorted(os.listdir(site["policy"].parent)) == ["policy.toml", "state"]


def _failing_on_temp_files(real):
    """``load_policy`` that refuses the temporary file the edit writes beside the policy."""
    def load(path):
        if str(path).endswith(".tmp"):
            raise ConfigError(f"site policy {path}: refused for the test")
        return real(path)
    return load


def test_an_audit_that_cannot_be_written_says_the_edit_is_applied(site):
    (site["state"] / "audit").write_text("a file where the audit folder belongs")
    with pytest.raises(AuditNotWritten, match="IS applied"):
        apply_edit(site["policy"], site["state"], "revoke", DIGEST, "")
    assert DIGEST in load_policy(site["policy"]).apps.revoked_sha256
