"""Approved apps only: the hospital's check of a run's app bundle (FAB), and its tools.

The site runner (:mod:`app.site_runtime.site_runner`) calls :func:`check_app` with
the site policy's ``[apps]`` rules (:mod:`clients.site.app_rules`) before
anything of a FAB is installed or imported. A FAB is approved by its SHA-256
digest (Flower's ``Fab.hash_str``, the digest of the bundle ``flwr run``
uploads) or by an Ed25519 signature (RFC 8032) over the domain-separated
message ``b"fedmed-app-approval-v2\\n" + digest + b"\\nexpires " + YYYY-MM-DD`` from a
key the hospital trusts; the coordinator sends ``<YYYY-MM-DD>:<base64 signature>``
as the run-config value :data:`SIGNATURE_KEY` (``make federate SIGN_KEY=...``).
The run config is not part of the FAB, so signing does not change the digest.
A signature is valid through its expiry date (UTC; default
:data:`SIGNATURE_DAYS` days after signing, ``make sign-app EXPIRES=YYYY-MM-DD``);
an expired one, or one in the format before expiry dates, approves nothing.
Revocation wins over every approval (``any = true`` included): a digest in the
policy's ``revoked-sha256`` never runs, and a key whose fingerprint is in
``revoked-keys`` approves nothing.

Command line (what the make targets call)::

    python -m app.site_runtime.app_approval keygen  --out DIR
    python -m app.site_runtime.app_approval hash    [--app DIR | --fab FILE]
    python -m app.site_runtime.app_approval sign    --key FILE [--app DIR] [--expires YYYY-MM-DD]
    python -m app.site_runtime.app_approval approve --policy /abs/policy.toml
                                                 (--sha256 HEX | --fab FILE | --app DIR)
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import logging
import os
import re
import sys
from collections.abc import Sequence
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (Encoding, NoEncryption,
                                                          PrivateFormat, PublicFormat,
                                                          load_pem_private_key)

from app.site_runtime.app_bundle import build_project_fab
from app.config.product_paths import PROJECT_ROOT
from clients.site.app_rules import (SHA256_HEX, AppApprovalError, AppRules, key_fingerprint,
                                    load_public_key, read_approved_file)
from clients.site.atomic_file import write_atomic
from clients.site.policy import SitePolicyError, load_policy
from strategies.wire.errors import SiteError

__all__ = ["AppNotApproved", "SIGNATURE_DAYS", "SIGNATURE_KEY", "approve", "check_app",
           "fab_sha256", "keygen", "main", "project_fab", "sign_app"]

log = logging.getLogger("fedmed.app_approval")

#: The run-config key that carries the coordinator's signature of the FAB digest.
SIGNATURE_KEY = "app-signature"
#: Days a signature stays valid by default (``make sign-app`` without ``EXPIRES=``).
SIGNATURE_DAYS = 90
_DOMAIN = b"fedmed-app-approval-v2\n"
_ISO_DATE = re.compile(r"\d{4}-\d\d-\d\d")
_MALFORMED = ("no signature from a trusted key; app-signature is not <YYYY-MM-DD>:<base64 "
              "Ed25519 signature>")
PRIVATE_KEY_FILE, PUBLIC_KEY_FILE = "app-signing.key", "app-signing.pub"


class AppNotApproved(SiteError):
    """The site refuses a run's app bundle; the text names the rule, never a path.

    Parameters
    ----------
    message : str
        ``app <12 hex> is not approved by this site (policy [apps]: <reason>)``.
    rule : str
        The policy section that refused it.
    """

    def __init__(self, message: str, rule: str = "apps") -> None:
        super().__init__(message)
        self.rule = rule

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (str(self), self.rule)


def _refusal(fab_hash: str, reason: str) -> AppNotApproved:
    short = "".join(c for c in fab_hash.lower() if c in "0123456789abcdef")[:12] or "(no hash)"
    return AppNotApproved(f"app {short} is not approved by this site (policy [apps]: {reason})")


def fab_sha256(fab_bytes: bytes) -> str:
    """The hex SHA-256 of a FAB, as Flower's ``Fab.hash_str`` (``flwr run`` computes it so)."""
    return hashlib.sha256(fab_bytes).hexdigest()


def project_fab(project_dir: Path) -> bytes:
    """The FAB ``flwr run <project_dir>`` submits (Flower's builder, deterministic; see
    :mod:`app.site_runtime.app_bundle`).

    Raises
    ------
    AppApprovalError
        The folder is no Flower app (no valid ``pyproject.toml``); names the folder.
    """
    try:
        return build_project_fab(Path(project_dir))
    except ValueError as exc:
        raise AppApprovalError(f"app folder {project_dir}: no Flower app bundle ({exc})") from exc


def _message(fab_hash: str, expires: date) -> bytes:
    return _DOMAIN + fab_hash.encode() + b"\nexpires " + expires.isoformat().encode()


def _today() -> date:
    return datetime.now(timezone.utc).date()


def _private_key(path: Path) -> Ed25519PrivateKey:
    try:
        key = load_pem_private_key(Path(path).read_bytes(), password=None)
    except OSError as exc:
        raise AppApprovalError(f"signing key {path}: unreadable ({exc.strerror})") from exc
    except (ValueError, TypeError) as exc:
        raise AppApprovalError(f"signing key {path}: not an unencrypted PEM private key") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise AppApprovalError(f"signing key {path}: not an Ed25519 key ({type(key).__name__})")
    return key


def sign_app(fab_hash: str, private_key: Path, expires: date | None = None) -> str:
    """``<YYYY-MM-DD>:<base64 Ed25519 signature>`` of ``fab_hash`` and the expiry date.

    Parameters
    ----------
    fab_hash : str
        The FAB digest.
    private_key : Path
        The PEM (PKCS8) Ed25519 key.
    expires : date, optional
        The last day (UTC) the signature approves the bundle; default
        :data:`SIGNATURE_DAYS` days from today.
    """
    expires = expires or _today() + timedelta(days=SIGNATURE_DAYS)
    raw = _private_key(private_key).sign(_message(fab_hash, expires))
    return f"{expires.isoformat()}:{base64.b64encode(raw).decode()}"


def _base64_signature(text: str) -> bytes:
    """The 64 raw bytes of a base64 Ed25519 signature, or b"" when ``text`` is none."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return b""
    return raw if len(raw) == 64 else b""


def _signer(rules: AppRules, fab_hash: str, signature: str, today: date) -> str:
    """``key <fingerprint>`` of the trusted key that signed ``fab_hash``, else the reason why not."""
    if not signature:
        return "no signature from a trusted key; the run config has no app-signature"
    expires_text, colon, encoded = signature.partition(":")
    if not colon:
        return ("old-format signature without an expiry date; the coordinator re-signs with "
                "`make sign-app` (EXPIRES=YYYY-MM-DD)") if _base64_signature(signature) \
            else _MALFORMED
    raw = _base64_signature(encoded)
    if not _ISO_DATE.fullmatch(expires_text) or not raw:
        return _MALFORMED
    try:
        expires = date.fromisoformat(expires_text)
    except ValueError:
        return _MALFORMED
    for path in rules.trusted_keys:
        try:
            key = load_public_key(path)
        except AppApprovalError as exc:
            log.warning("trusted key skipped: %s", exc)
            continue
        try:
            key.verify(raw, _message(fab_hash, expires))
        except InvalidSignature:
            continue
        fingerprint = key_fingerprint(key)
        if fingerprint in rules.revoked_keys:
            return f"revoked-keys lists the signing key {fingerprint}"
        if today > expires:
            return (f"signature expired on {expires.isoformat()}; the coordinator re-signs with "
                    "`make sign-app` (EXPIRES=YYYY-MM-DD)")
        return f"key {fingerprint}"
    return "no signature from a trusted key"


def check_app(rules: AppRules, fab_hash: str, fab_bytes: bytes, signature: str,
              today: date | None = None) -> str:
    """Whether the site runs this FAB: how it was approved, or :class:`AppNotApproved`.

    Parameters
    ----------
    rules : AppRules
        The site policy's ``[apps]`` section.
    fab_hash : str
        The digest the SuperLink sent with the FAB; recomputed from ``fab_bytes``.
    fab_bytes : bytes
        The bundle itself.
    signature : str
        The run config's :data:`SIGNATURE_KEY` value ("" when absent).
    today : date, optional
        The day a signature's expiry is compared with (default: today, UTC).

    Returns
    -------
    str
        ``"any"``, ``"sha256"`` (listed in approved-sha256 or the approved-file,
        which is re-read on every call) or ``"key <12 hex>"`` (a trusted key's
        signature verifies).

    Raises
    ------
    AppNotApproved
        The bundle does not match its digest, is revoked, or no rule approves it;
        the text names the rule and the first 12 hex digits of the digest, never
        a path.
    """
    if fab_sha256(fab_bytes) != fab_hash:
        raise _refusal(fab_hash, "bundle does not match its hash")
    if fab_hash in rules.revoked_sha256:
        raise _refusal(fab_hash, "revoked-sha256 lists this bundle; revocation wins over every "
                                 "approval")
    if rules.any:
        return "any"
    if fab_hash in rules.approved_sha256:
        return "sha256"
    listed = "not in approved-sha256 or approved-file"
    if rules.approved_file:
        try:
            if fab_hash in read_approved_file(rules.approved_file):
                return "sha256"
        except AppApprovalError as exc:
            log.warning("%s", exc)
            listed = "not in approved-sha256; approved-file unreadable or malformed, see the site log"
    how = _signer(rules, fab_hash, signature, today or _today())
    if how.startswith("key "):
        return how
    raise _refusal(fab_hash, f"{listed}, {how}")


def keygen(out: Path) -> tuple[Path, Path]:
    """Write ``out/app-signing.key`` (PKCS8 PEM, mode 0600) and ``out/app-signing.pub``.

    Raises
    ------
    AppApprovalError
        Either file exists already (a key is never overwritten).
    """
    private, public = out / PRIVATE_KEY_FILE, out / PUBLIC_KEY_FILE
    for path in (private, public):
        if path.exists():
            raise AppApprovalError(f"{path} exists; refusing to overwrite a signing key")
    out.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(Encoding.PEM,
                                                     PublicFormat.SubjectPublicKeyInfo))
    return private, public


def approve(policy_path: Path, fab_hash: str) -> bool:
    """Append ``fab_hash`` to the approved-file the policy names; False if already there.

    The policy file itself is never edited; the approved-file is created if
    missing and rewritten atomically (the site re-reads it on every message).

    Raises
    ------
    SitePolicyError
        The policy is invalid or names no approved-file.
    AppApprovalError
        ``fab_hash`` is not 64 lowercase hex digits.
    """
    if not SHA256_HEX.fullmatch(fab_hash):
        raise AppApprovalError(f"--sha256 must be 64 lowercase hex digits, got {fab_hash!r}")
    target = load_policy(policy_path).apps.approved_file
    if not target:
        raise SitePolicyError(f"site policy {policy_path} names no approved-file: add "
                              f"approved-file = \"/abs/approved-apps.txt\" under [apps]")
    if fab_hash in read_approved_file(target):
        return False
    old = Path(target).read_bytes() if Path(target).exists() else b""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    line = f"{fab_hash}  # approved {stamp}\n".encode()
    glue = b"\n" if old and not old.endswith(b"\n") else b""
    write_atomic(Path(target), lambda handle: handle.write(old + glue + line))
    return True


def _digest(args: argparse.Namespace) -> str:
    if getattr(args, "sha256", None):
        return str(args.sha256)
    if args.fab is not None:
        try:
            return fab_sha256(args.fab.read_bytes())
        except OSError as exc:
            raise AppApprovalError(f"FAB {args.fab}: unreadable ({exc.strerror})") from exc
    return fab_sha256(project_fab(args.app))


def _cmd_keygen(args: argparse.Namespace) -> None:
    private, public = keygen(args.out)
    print(f"private key {private} (keep it; mode 0600)\npublic key  {public} (send it to the "
          f"hospitals: trusted-keys under [apps])\nfingerprint "
          f"{key_fingerprint(load_public_key(public))}")


def _cmd_hash(args: argparse.Namespace) -> None:
    print(_digest(args))


def _cmd_sign(args: argparse.Namespace) -> None:
    _private_key(args.key)  # a wrong key fails before the (slow) FAB build
    if args.expires is not None and args.expires < _today():
        raise AppApprovalError(f"--expires {args.expires.isoformat()} is in the past (today is "
                               f"{_today().isoformat()} UTC): every site would refuse the "
                               "signature; give a later date")
    digest = fab_sha256(project_fab(args.app))
    signature = sign_app(digest, args.key, args.expires)
    print(f"sha256    {digest}\nexpires   {signature.split(':', 1)[0]}\nsignature {signature}")


def _iso_date(text: str) -> date:
    """``--expires``: a YYYY-MM-DD date."""
    try:
        if _ISO_DATE.fullmatch(text):
            return date.fromisoformat(text)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"--expires must be a date YYYY-MM-DD, got {text!r}")


def _cmd_approve(args: argparse.Namespace) -> None:
    digest = _digest(args)
    added = approve(args.policy, digest)
    if added and args.state is not None:
        from app.site_runtime.site_audit import audit_event
        audit_event(args.state, {"kind": "app-approved", "app": digest, "by": "cli",
                                 "reason": "make approve-app"})
    print(f"app {digest} {'approved' if added else 'was already approved'} "
          f"(approved-file of {args.policy})")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def source(p: argparse.ArgumentParser, sha256: bool = False) -> None:
        group = p.add_mutually_exclusive_group(required=sha256)
        group.add_argument("--app", type=Path, default=PROJECT_ROOT,
                           help="project folder (default: this project)")
        group.add_argument("--fab", type=Path, default=None, help="a built .fab file")
        if sha256:
            group.add_argument("--sha256", default=None, help="the FAB digest (64 hex)")

    p = sub.add_parser("keygen", help="create the coordinator's app-signing key pair")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=_cmd_keygen)
    p = sub.add_parser("hash", help="print the sha256 of the FAB flwr run submits")
    source(p)
    p.set_defaults(func=_cmd_hash)
    p = sub.add_parser("sign", help="print the sha256 and signature of the project's FAB")
    p.add_argument("--key", type=Path, required=True)
    p.add_argument("--app", type=Path, default=PROJECT_ROOT)
    p.add_argument("--expires", type=_iso_date, default=None,
                   help=f"last day (UTC) the signature approves the app (default: "
                        f"{SIGNATURE_DAYS} days from today)")
    p.set_defaults(func=_cmd_sign)
    p = sub.add_parser("approve", help="append a FAB digest to the policy's approved-file")
    p.add_argument("--policy", type=Path, required=True)
    p.add_argument("--state", type=Path, default=None,
                   help="the site's state dir: the approval goes to its audit log")
    source(p, sha256=True)
    p.set_defaults(func=_cmd_approve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = _parser().parse_args(argv)
    try:
        args.func(args)
    except (AppApprovalError, SitePolicyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
