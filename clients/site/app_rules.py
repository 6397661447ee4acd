"""The ``[apps]`` section of the site policy: which app bundles (FABs) a hospital runs.

A FAB is approved by its SHA-256 digest (``approved-sha256``, or a line of the
``approved-file`` that ``make approve-app`` appends to and the site re-reads on
every message), or by an Ed25519 signature (Bernstein et al. 2012, "High-speed
high-security signatures") over its digest and an expiry date from one of the
``trusted-keys``. ``any = true`` runs every bundle (development only).
Revocation wins over every approval, ``any = true`` included: a bundle whose
digest is in ``revoked-sha256`` never runs, and a signature by a key whose
fingerprint (:func:`key_fingerprint`) is in ``revoked-keys`` approves nothing. The check itself is
:func:`app.site_runtime.app_approval.check_app`; this module parses and validates
the section at load time (with ``cryptography`` for the key files, so that a
bad key is reported when the SuperNode starts, not at the first message)::

    [apps]
    any = false
    approved-sha256 = ["3fa2...64 hex"]
    approved-file = "/abs/approved-apps.txt"   # one digest per line, '#' comments
    trusted-keys = ["/abs/coordinator-app-signing.pub"]
    revoked-sha256 = []                        # bundles never run, whatever approves them
    revoked-keys = []                          # fingerprints (12 hex) of keys that sign no more

Unlike the other rules, a missing ``any`` is ``false``: a policy file without
``[apps]`` approves no bundle (a hospital must say which code it runs); only
:meth:`SitePolicy.permissive`, the policy of a site started without a policy
file, runs any bundle. ``any = true`` together with approvals is refused.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (Encoding, PublicFormat,
                                                          load_pem_public_key)

from strategies.wire.errors import ConfigError

__all__ = ["AppApprovalError", "AppRules", "FINGERPRINT_HEX", "SHA256_HEX", "key_fingerprint",
           "load_public_key", "parse_app_rules", "read_approved_file"]

#: A FAB digest as this policy spells it: 64 lowercase hex digits.
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
#: A public key's fingerprint as :func:`key_fingerprint` prints it: 12 lowercase hex digits.
FINGERPRINT_HEX = re.compile(r"[0-9a-f]{12}")
_KEYS = ("any", "approved-sha256", "approved-file", "trusted-keys", "revoked-sha256",
         "revoked-keys")


class AppApprovalError(ConfigError):
    """An app-approval file (approved-file, trusted or signing key) is unreadable or malformed."""


@dataclass(frozen=True)
class AppRules:
    """The ``[apps]`` rules of a site (see the module docstring); paths are absolute strings."""

    any: bool = True
    approved_sha256: tuple[str, ...] = ()
    approved_file: str = ""
    trusted_keys: tuple[str, ...] = ()
    revoked_sha256: tuple[str, ...] = ()
    revoked_keys: tuple[str, ...] = ()


def key_fingerprint(key: Ed25519PublicKey) -> str:
    """The first 12 hex digits of the SHA-256 of the key's 32 raw bytes."""
    return hashlib.sha256(key.public_bytes(Encoding.Raw, PublicFormat.Raw)).hexdigest()[:12]


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    """Read an Ed25519 public key (PEM, SubjectPublicKeyInfo); the error names the file."""
    try:
        key = load_pem_public_key(Path(path).read_bytes())
    except OSError as exc:
        raise AppApprovalError(f"public key {path}: unreadable ({exc.strerror})") from exc
    except ValueError as exc:
        raise AppApprovalError(f"public key {path}: not a PEM public key") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise AppApprovalError(f"public key {path}: not an Ed25519 key "
                               f"({type(key).__name__})")
    return key


def read_approved_file(path: str | Path) -> frozenset[str]:
    """The digests listed in an approved-file; a missing file approves nothing.

    Raises
    ------
    AppApprovalError
        The file is unreadable or a line (comments after ``#`` and blank lines
        aside) is not 64 lowercase hex digits; the message names file and line.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return frozenset()
    except (OSError, UnicodeDecodeError) as exc:
        raise AppApprovalError(f"approved-file {path}: unreadable ({exc})") from exc
    digests = set()
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.split("#", 1)[0].strip()
        if entry and not SHA256_HEX.fullmatch(entry):
            raise AppApprovalError(f"approved-file {path}: line {number} is not a sha256 "
                                   f"(64 lowercase hex digits), got {entry[:80]!r}")
        if entry:
            digests.add(entry)
    return frozenset(digests)


def _absolute(value: Any, where: str) -> str:
    if not isinstance(value, str) or not Path(value).is_absolute():
        raise AppApprovalError(f"{where} must be an absolute path, got {value!r}")
    return value


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise AppApprovalError(f"{where} must be a list of strings, got {value!r}")
    return value


def _hex_list(table: Mapping[str, Any], key: str, where: str, pattern: re.Pattern[str],
              what: str) -> tuple[str, ...]:
    """The sorted distinct entries of list ``key``, each matching ``pattern`` (``what``)."""
    entries = _strings(table.get(key, []), f"{where}{key}'")
    for entry in entries:
        if not pattern.fullmatch(entry):
            raise AppApprovalError(f"{where}{key}' entries must be {what}, got {entry!r}")
    return tuple(sorted(set(entries)))


def parse_app_rules(table: Mapping[str, Any], source: str) -> AppRules:
    """Check the ``[apps]`` table of the policy file ``source``.

    Every digest must be 64 lowercase hex digits, every path absolute, every
    trusted key a readable Ed25519 public key, an existing approved-file well
    formed (a missing one approves nothing until ``make approve-app`` creates it).

    Raises
    ------
    AppApprovalError
        Naming the policy file and the key (``'apps.trusted-keys'``).
    """
    where = f"site policy {source}: 'apps."
    for key in table:
        if key not in _KEYS:
            raise AppApprovalError(f"{where}{key}' is an unknown key; known: {list(_KEYS)}")
    run_any = table.get("any", False)
    if not isinstance(run_any, bool):
        raise AppApprovalError(f"{where}any' must be true or false, got {run_any!r}")
    sha256 = "64 lowercase hex digits"
    digests = _hex_list(table, "approved-sha256", where, SHA256_HEX, sha256)
    approved_file = table.get("approved-file", "")
    if approved_file != "":
        approved_file = _absolute(approved_file, f"{where}approved-file'")
        try:
            read_approved_file(approved_file)
        except AppApprovalError as exc:
            raise AppApprovalError(f"{where}approved-file': {exc}") from exc
    trusted = [_absolute(p, f"{where}trusted-keys' entry")
               for p in _strings(table.get("trusted-keys", []), f"{where}trusted-keys'")]
    for path in trusted:
        try:
            load_public_key(path)
        except AppApprovalError as exc:
            raise AppApprovalError(f"{where}trusted-keys': {exc}") from exc
    if run_any and (digests or approved_file or trusted):
        raise AppApprovalError(f"{where}any' is true but the section lists approvals; "
                               "set any = false to run only the approved apps")
    return AppRules(any=run_any, approved_sha256=digests, approved_file=approved_file,
                    trusted_keys=tuple(trusted),
                    revoked_sha256=_hex_list(table, "revoked-sha256", where, SHA256_HEX, sha256),
                    revoked_keys=_hex_list(table, "revoked-keys", where, FINGERPRINT_HEX,
                                           "key fingerprints (12 lowercase hex digits)"))
