"""The console's Apps page: which app bundles the site runs, by which approval, until when.

Read from the policy's ``[apps]`` section (:mod:`clients.site.app_rules`) and the
audit log's message records:

* digests approved in ``approved-sha256`` and the ``approved-file``'s lines (with the
  date comment ``make approve-app`` writes): approved by digest, they never expire;
* trusted keys (file, fingerprint) and revoked digests and keys;
* the apps seen in the audit log: last seen, last decision, and how the policy in
  force treats them now. A bundle approved only by a trusted key's signature runs
  through the expiry date signed with it (the run's ``app-signature``,
  :mod:`app.site_runtime.app_approval`): the runtime's audit record of its last
  message holds that date and the key that approved it;
* the history of the changes to the apps: each approve, revoke and undone revoke (made in
  the console or by ``make approve-app``) and each ``policy-change``, with when, who
  (``by``) and why, newest first (:data:`HISTORY_ROWS` at most). A revoked app is offered
  "Undo revoke" (:mod:`app.site_runtime.policy_edit`), which restores its approval before
  the revoke instead of adding a digest approval.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clients.site.app_rules import (SHA256_HEX, AppApprovalError, AppRules, key_fingerprint,
                                    load_public_key)

__all__ = ["HISTORY_KINDS", "HISTORY_ROWS", "apps_view", "approved_file_lines", "history",
           "standing"]

#: The audit records of a change to the apps, and how the page names each.
HISTORY_KINDS = {"app-approved": "approved", "app-revoked": "revoked",
                 "app-revoke-undone": "revoke undone", "policy-change": "policy changed"}
#: Changes the page lists (the Activity page has them all).
HISTORY_ROWS = 50


def approved_file_lines(path: str) -> tuple[list[dict[str, str]], str]:
    """``([{"app", "note"}], error)``: the approved-file's digests with their comments."""
    if not path:
        return [], ""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return [], ""
    except (OSError, UnicodeDecodeError) as exc:
        return [], f"approved-file {path}: unreadable ({exc})"
    rows = []
    for line in text.splitlines():
        entry, _, note = line.partition("#")
        if SHA256_HEX.fullmatch(entry.strip()):
            rows.append({"app": entry.strip(), "note": note.strip()})
    return rows, ""


def standing(rules: AppRules, app: str, in_file: set[str]) -> str:
    """How the policy in force treats digest ``app``: revoked, approved (and until when), or not."""
    if app in rules.revoked_sha256:
        return "revoked (revoked-sha256)"
    if rules.any:
        return "runs: any = true (development only), no expiry"
    if app in rules.approved_sha256:
        return "approved by digest (approved-sha256), no expiry"
    if app in in_file:
        return "approved by digest (approved-file), no expiry"
    if rules.trusted_keys:
        return ("not approved by digest: runs only with a trusted key's signature, valid "
                "through the expiry date it was signed with")
    return "not approved"


def history(records: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The changes to the apps, newest first: seq, time, change, app, who, reason, detail."""
    rows = [{"seq": str(record.get("seq", "")), "time": str(record.get("time", "")),
             "change": HISTORY_KINDS[record["kind"]], "app": str(record.get("app") or ""),
             "by": str(record.get("by") or "unknown"), "reason": str(record.get("reason") or ""),
             "detail": str(record.get("changes") or record.get("fingerprint") or "")}
            for record in records if record.get("kind") in HISTORY_KINDS]
    return rows[::-1][:HISTORY_ROWS]


def apps_view(rules: AppRules, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Everything the Apps page lists (see the module docstring)."""
    file_rows, file_error = approved_file_lines(rules.approved_file)
    in_file = {row["app"] for row in file_rows}
    keys = []
    for path in rules.trusted_keys:
        try:
            fingerprint, error = key_fingerprint(load_public_key(path)), ""
        except AppApprovalError as exc:
            fingerprint, error = "", str(exc)
        keys.append({"file": path, "fingerprint": fingerprint, "error": error,
                     "revoked": fingerprint in rules.revoked_keys})
    seen: dict[str, dict[str, Any]] = {}
    for record in records:
        app = record.get("app")
        if record.get("kind") != "message" or not isinstance(app, str) \
                or not SHA256_HEX.fullmatch(app):
            continue
        seen[app] = {"app": app, "last_seen": record.get("time", ""),
                     "decision": record.get("decision", ""), "rule": record.get("rule") or "",
                     "approval": str(record.get("approval") or ""),
                     "expires": str(record.get("signature_expires") or "")}
    for row in seen.values():
        row["standing"] = standing(rules, row["app"], in_file)
        if row["standing"].startswith("not approved by digest") \
                and row["approval"].startswith("key ") and row["expires"]:
            row["standing"] = (f"approved by the signature of {row['approval']} (last run), "
                               f"valid through {row['expires']}")
        row["revoked"] = row["app"] in rules.revoked_sha256
    approved = [{"app": app, "where": "approved-sha256", "note": "no expiry",
                 "revoked": app in rules.revoked_sha256} for app in rules.approved_sha256]
    approved += [{"app": row["app"], "where": "approved-file",
                  "note": f"{row['note'] or 'no date'}; no expiry",
                  "revoked": row["app"] in rules.revoked_sha256} for row in file_rows]
    return {"any": rules.any, "approved": approved, "approved_file": rules.approved_file,
            "approved_file_error": file_error, "trusted_keys": keys,
            "revoked": list(rules.revoked_sha256), "revoked_keys": list(rules.revoked_keys),
            "seen": sorted(seen.values(), key=lambda r: str(r["last_seen"]), reverse=True),
            "history": history(records)}
