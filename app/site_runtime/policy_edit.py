"""Approve or revoke an app bundle from the console: the policy file edited atomically, audited.

The hospital owns its policy file and its comments, so the file is edited as
text: only the lines of the one key that changes in ``[apps]`` are rewritten (the
key is inserted when missing, ``[apps]`` appended when the file has none). The new
text goes to a temporary file in the policy's folder, is checked with
:func:`~clients.site.policy.load_policy` (a file the site would refuse never
replaces the old one), fsynced and renamed over the old one (``os.replace``), so
the site runner (which re-reads the policy on every message) sees the old rules
or the new ones, never half a file.

* **approve** a digest: when the policy names an ``approved-file``, it is appended
  there (:func:`app.site_runtime.app_approval.approve`); else it is added to
  ``approved-sha256``. A revoked digest is also removed from ``revoked-sha256``
  (revocation would win otherwise). Under ``any = true`` only that removal applies.
* **revoke** a digest: it is added to ``revoked-sha256`` and removed from
  ``approved-sha256`` (an approved-file entry stays: revocation wins over it).
* **undo-revoke**: the revocation is taken back, restoring the approval the app had
  before it, never adding one: the digest leaves ``revoked-sha256`` and goes back into
  ``approved-sha256`` only when the revoke being undone took it out of there (its audit
  record's ``changes``, :func:`last_revoke`). An app approved by a trusted key's
  signature, or by the approved-file, runs on that approval again; "approve" instead
  adds a digest approval that never expires.

Each applied edit appends ``app-approved`` / ``app-revoked`` / ``app-revoke-undone`` (the
revoke's ``seq`` in ``undoes``) to the audit log, with ``by`` (who: the console's admin
session, :func:`app.site_runtime.console.actor`), the ``reason`` and the ``changes`` (one
string, ``; ``-separated), and,
when the policy's fingerprint is not the last one audited, ``policy-change``
(:mod:`app.site_runtime.site_audit`, which every writer of the log goes through).
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.site_runtime.app_approval import approve
from clients.site.app_rules import SHA256_HEX, read_approved_file
from clients.site.policy import SitePolicy, load_policy
from strategies.wire.errors import ConfigError, FedMedError, SiteError

__all__ = ["ACTIONS", "AuditNotWritten", "DONE", "PolicyEdit", "apply_edit", "last_revoke",
           "plan_edit", "set_apps_list"]

#: The edits the console offers.
ACTIONS = ("approve", "revoke", "undo-revoke")
#: Each action as done (the flash line), and its audit record's kind.
DONE = {"approve": "approved", "revoke": "revoked", "undo-revoke": "revoke undone"}
_KINDS = {"approve": "app-approved", "revoke": "app-revoked", "undo-revoke": "app-revoke-undone"}
_EDIT_LOCK = threading.Lock()
_TABLE = re.compile(r"^\s*\[\s*(\[?)\s*([^\]]*?)\s*\]")
_BLANK_OR_COMMENT = re.compile(r"^\s*(#.*)?$")


class AuditNotWritten(SiteError):
    """An edit was applied to the policy but its audit record could not be written."""


@dataclass(frozen=True)
class PolicyEdit:
    """What an approve or revoke changes (``changes`` empty: nothing to do).

    Attributes
    ----------
    action, app : str
        ``approve`` or ``revoke``; the 64-hex digest.
    changes : tuple of str
        One readable line per change (``apps.revoked-sha256: add <digest>``).
    text : str
        The policy file's new text ("" when the file itself does not change).
    append_to_file : str
        The approved-file the digest is appended to ("" for none).
    before, after : str
        The policy's fingerprint before and after.
    undoes : int or None
        undo-revoke: the audit ``seq`` of the revoke it takes back (None: a revoke not made
        in the console, or none).
    """

    action: str
    app: str
    changes: tuple[str, ...]
    text: str
    append_to_file: str
    before: str
    after: str
    undoes: int | None = None


def _key_pattern(key: str) -> re.Pattern[str]:
    return re.compile(rf"^\s*(?:{re.escape(key)}|\"{re.escape(key)}\"|'{re.escape(key)}')\s*=")


def _apps_bounds(lines: list[str]) -> tuple[int, int] | None:
    """``(header line, end line exclusive)`` of the ``[apps]`` table, None without one."""
    start = None
    for number, line in enumerate(lines):
        match = _TABLE.match(line)
        if not match:
            continue
        if start is not None:
            return start, number
        if not match.group(1) and match.group(2) == "apps":
            start = number
    return None if start is None else (start, len(lines))


def _value_end(lines: list[str], first: int, end: int) -> int:
    """The line after the last one of the key/value starting on line ``first``."""
    value = lines[first].split("=", 1)[1]
    for last in range(first, end):
        if last > first:
            value += "\n" + lines[last]
        try:
            tomllib.loads("v = " + value)
        except tomllib.TOMLDecodeError:
            continue
        return last + 1
    raise ConfigError(f"cannot find where the value of line {first + 1} ends")


def _formatted(indent: str, key: str, values: list[str], comment: str) -> list[str]:
    if len(values) <= 1:
        inner = ", ".join(f'"{v}"' for v in values)
        return [f"{indent}{key} = [{inner}]{comment}"]
    return [f"{indent}{key} = [{comment}", *(f'{indent}    "{v}",' for v in values), f"{indent}]"]


def set_apps_list(text: str, key: str, values: list[str], source: str = "policy") -> str:
    """``text`` with ``[apps]``'s list ``key`` set to ``values``; every other line kept.

    Raises
    ------
    ConfigError
        ``[apps]`` is not a plain table of the file (an inline table, dotted keys), or
        the edited text does not read back as ``values``; names ``source`` and the key.
    """
    lines = text.splitlines()
    bounds = _apps_bounds(lines)
    if bounds is None:
        if "apps" in tomllib.loads(text):
            raise ConfigError(f"site policy {source}: 'apps' is not written as an [apps] "
                              "table; edit the file by hand")
        lines += ["", "[apps]", *_formatted("", key, values, "")]
    else:
        start, end = bounds
        pattern = _key_pattern(key)
        first = next((n for n in range(start + 1, end) if pattern.match(lines[n])), None)
        if first is None:
            content = [n for n in range(start + 1, end) if not _BLANK_OR_COMMENT.match(lines[n])]
            at = content[-1] + 1 if content else start + 1
            lines[at:at] = _formatted("", key, values, "")
        else:
            stop = _value_end(lines, first, end)
            line = lines[first]
            indent = line[:len(line) - len(line.lstrip())]
            tail = line[line.rfind("]") + 1:] if stop == first + 1 else ""
            comment = "  " + tail.strip() if tail.strip().startswith("#") else ""
            lines[first:stop] = _formatted(indent, key, values, comment)
    edited = "\n".join(lines) + "\n"
    if tomllib.loads(edited).get("apps", {}).get(key) != values:
        raise ConfigError(f"site policy {source}: the edit of 'apps.{key}' did not read back; "
                          "edit the file by hand")
    return edited


def _load_text(text: str, source: Path) -> SitePolicy:
    """The policy ``text`` would be (checked in a private temporary folder)."""
    with tempfile.TemporaryDirectory(prefix="fedmed-policy-") as folder:
        path = Path(folder) / source.name
        path.write_text(text, encoding="utf-8")
        try:
            return load_policy(path)
        except ConfigError as exc:
            raise ConfigError(f"site policy {source}: the edit would make the policy invalid "
                              f"({str(exc).replace(str(path), source.name)})") from None


def last_revoke(state_dir: Path | None, app: str) -> dict[str, Any] | None:
    """The audit log's last console ``app-revoked`` record of ``app`` not undone since (None:
    none, or no ``state_dir``)."""
    if state_dir is None:
        return None
    from app.site_runtime.audit_log import AuditLog

    found = None
    for record in AuditLog(state_dir).records():
        if record.get("app") != app:
            continue
        if record.get("kind") == "app-revoked":
            found = record
        elif record.get("kind") in ("app-revoke-undone", "app-approved"):
            found = None
    return found


def plan_edit(policy_path: Path, action: str, app: str,
              state_dir: Path | None = None) -> PolicyEdit:
    """What ``action`` on ``app`` would change in the policy (nothing is written); an
    undo-revoke reads the revoke it takes back from ``state_dir``'s audit log.

    Raises
    ------
    ConfigError
        An unknown action, a digest that is not 64 lowercase hex digits, an unreadable
        policy, or an edit the policy would not accept.
    """
    if action not in ACTIONS:
        raise ConfigError(f"policy edit: unknown action {action!r}; known: {list(ACTIONS)}")
    if not SHA256_HEX.fullmatch(app):
        raise ConfigError(f"policy edit: the app digest must be 64 lowercase hex digits, "
                          f"got {app[:80]!r}")
    policy_path = Path(policy_path)
    policy = load_policy(policy_path)
    rules = policy.apps
    text = policy_path.read_text(encoding="utf-8")
    approved, revoked = list(rules.approved_sha256), list(rules.revoked_sha256)
    changes: list[str] = []
    append_to, undoes = "", None
    if action == "undo-revoke":
        revoke = last_revoke(state_dir, app) if app in revoked else None
        undoes = None if revoke is None else int(revoke["seq"])
        if app in revoked:
            revoked.remove(app)
            changes.append(f"apps.revoked-sha256: remove {app}")
        took_out = f"apps.approved-sha256: remove {app}"
        if revoke is not None and took_out in str(revoke.get("changes", "")).split("; ") \
                and app not in approved:
            approved = sorted(approved + [app])
            changes.append(f"apps.approved-sha256: add {app} (back, as before the revoke)")
    elif action == "revoke":
        if app not in revoked:
            revoked = sorted(revoked + [app])
            changes.append(f"apps.revoked-sha256: add {app}")
        if app in approved:
            approved.remove(app)
            changes.append(f"apps.approved-sha256: remove {app}")
    else:
        if app in revoked:
            revoked.remove(app)
            changes.append(f"apps.revoked-sha256: remove {app}")
        in_file = bool(rules.approved_file) and app in read_approved_file(rules.approved_file)
        if not (rules.any or app in approved or in_file):
            if rules.approved_file:
                append_to = rules.approved_file
                changes.append(f"approved-file {rules.approved_file}: append {app}")
            else:
                approved = sorted(approved + [app])
                changes.append(f"apps.approved-sha256: add {app}")
    new_text = text
    if list(rules.approved_sha256) != approved:
        new_text = set_apps_list(new_text, "approved-sha256", approved, str(policy_path))
    if list(rules.revoked_sha256) != revoked:
        new_text = set_apps_list(new_text, "revoked-sha256", revoked, str(policy_path))
    after = _load_text(new_text, policy_path).fingerprint if new_text != text \
        else policy.fingerprint
    return PolicyEdit(action, app, tuple(changes), new_text if new_text != text else "",
                      append_to, policy.fingerprint, after, undoes)


def _replace_atomically(path: Path, text: str) -> None:
    """Write ``text`` beside ``path``, check it as a policy, fsync, rename over ``path``."""
    mode = path.stat().st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        try:
            load_policy(tmp)
        except ConfigError as exc:
            raise ConfigError(f"site policy {path}: the edit would make the policy invalid "
                              f"({exc})") from None
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def _audit(state_dir: Path, record: dict[str, Any], edit: PolicyEdit, by: str) -> None:
    """Append the act, then (when the fingerprint changed) ``policy-change``, unless a
    writer already audited the new fingerprint."""
    from app.site_runtime.site_audit import audit_event, audit_policy

    audit_event(state_dir, record)
    if edit.after != edit.before:
        audit_policy(state_dir, edit.after, by)


def apply_edit(policy_path: Path, state_dir: Path, action: str, app: str, reason: str,
               expect_fingerprint: str | None = None, by: str = "console") -> PolicyEdit:
    """Apply :func:`plan_edit`'s changes and audit them; returns what was changed.

    Parameters
    ----------
    policy_path, state_dir : Path
        The site policy; the state dir whose audit log records the act.
    action, app : str
        ``approve`` or ``revoke``; the digest.
    reason : str
        Why (recorded in the audit log).
    expect_fingerprint : str, optional
        The fingerprint the admin confirmed; another one means the policy changed
        meanwhile and nothing is done.
    by : str
        Who acted (the console's admin session and client: ``console admin ...``).

    Raises
    ------
    ConfigError
        As :func:`plan_edit`, or the policy changed since the confirmation.
    AuditNotWritten
        The edit is applied but the audit log could not record it (its message says so).
    """
    with _EDIT_LOCK:
        edit = plan_edit(policy_path, action, app, Path(state_dir))
        if expect_fingerprint is not None and edit.before != expect_fingerprint:
            raise ConfigError(f"site policy {policy_path} changed since the confirmation "
                              f"(fingerprint {expect_fingerprint}, now {edit.before}); nothing "
                              "was changed, review the edit again")
        if not edit.changes:
            return edit
        if edit.text:
            _replace_atomically(Path(policy_path), edit.text)
        if edit.append_to_file:
            try:
                approve(Path(policy_path), app)
            except FedMedError as exc:
                raise ConfigError(f"approved-file {edit.append_to_file}: {exc}") from exc
        record = {"kind": _KINDS[action], "app": app, "by": by,
                  "reason": reason or "no reason given", "changes": "; ".join(edit.changes)}
        if edit.undoes is not None:
            record["undoes"] = edit.undoes
        try:
            _audit(Path(state_dir), record, edit, by)
        except (FedMedError, OSError) as exc:
            raise AuditNotWritten(f"the {action} of app {app[:12]} IS applied to {policy_path}, "
                                  f"but the audit log of {state_dir} could not record it "
                                  f"({exc}); fix the log, then record the act by hand") from exc
        return edit
