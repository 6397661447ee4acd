"""The federation's PKI for SecAgg+: long-term Ed25519 site keys and the roster of them.

Bell et al. (CCS 2020, section 2, "a PKI") and Bonawitz et al. (CCS 2017, section 4.4)
assume every site can check that a round key or a survivor set was signed by the site
it claims to come from. Each hospital holds one private signing key (PKCS#8 PEM, mode
0600, named by its policy's ``secure-aggregation.signing-key``) and the federation's
roster (named by ``secure-aggregation.roster``): a JSON file ``{"sites": {name:
base64 raw Ed25519 public key}}`` that every hospital receives and checks by its
fingerprint out of band (:func:`roster_fingerprint`, ``make secagg-roster-list``).

Two statements are signed, each a short canonical JSON byte string with a domain tag,
so one can never be replayed as the other, in another federation or another round:

* :func:`key_statement` -- a site's two round public keys, bound to the federation,
  the server round, its participant index and its site name (the setup reply);
* :func:`survivor_statement` -- the survivor set ``U3`` (indices and names) of one
  round (the consistency stage's reply, Bonawitz et al. 2017, ConsistencyCheck).

All cryptography is :mod:`cryptography`'s Ed25519; nothing here is hand-written.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (Ed25519PrivateKey,
                                                               Ed25519PublicKey)

from strategies.wire.secure_aggregation.errors import SecAggConfigError, SecAggError

__all__ = ["SIGNATURE_BYTES", "SiteIdentity", "generate_key", "key_statement", "load_key",
           "load_roster",
           "public_text", "roster_fingerprint", "survivor_statement", "write_roster"]

#: Bytes of one Ed25519 signature.
SIGNATURE_BYTES = 64


def _canonical(tag: str, fields: Mapping[str, object]) -> bytes:
    return json.dumps({"statement": tag, **fields}, sort_keys=True,
                      separators=(",", ":")).encode("utf-8")


def key_statement(federation: str, server_round: int, index: int, site: str,
                  key_c: bytes, key_s: bytes) -> bytes:
    """What a site signs at setup: its two round public keys and who and where it is."""
    return _canonical("secagg-round-keys", {
        "federation": federation, "round": server_round, "index": index, "site": site,
        "key-c": key_c.hex(), "key-s": key_s.hex()})


def survivor_statement(federation: str, server_round: int,
                       survivors: Sequence[tuple[int, str]], participants: int,
                       threshold: int) -> bytes:
    """What a site signs at the consistency stage: the whole survivor set ``U3`` and the
    round plan's ``n`` and ``t`` (signers of one set agree on the plan too: a coordinator
    that told some sites a smaller ``n`` cannot lower the signatures they need)."""
    return _canonical("secagg-survivors", {
        "federation": federation, "round": server_round, "participants": participants,
        "threshold": threshold, "survivors": [[i, name] for i, name in sorted(survivors)]})


def generate_key(path: Path) -> Ed25519PrivateKey:
    """A fresh signing key written to ``path`` (PKCS#8 PEM, mode 0600; never overwrites)."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(handle, "wb") as out:
        out.write(pem)
    return key


def load_key(path: Path, data: bytes | None = None) -> Ed25519PrivateKey:
    """The private signing key at ``path``, or in ``data`` (the file's bytes, read by the
    caller) (:class:`SecAggConfigError` naming the file)."""
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes() if data is None
                                                 else data, password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise SecAggConfigError(f"secure-aggregation.signing-key {path}: unreadable "
                                f"({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SecAggConfigError(f"secure-aggregation.signing-key {path}: not an Ed25519 key")
    return key


def public_text(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The roster's text of a key's public half (base64 of the 32 raw bytes)."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def load_roster(path: Path, data: bytes | None = None) -> dict[str, Ed25519PublicKey]:
    """The roster at ``path`` (or in ``data``, its bytes): site name -> public key
    (:class:`SecAggConfigError` naming the file and the site when unreadable)."""
    try:
        text = Path(path).read_bytes() if data is None else data
        sites = json.loads(text.decode("utf-8"))["sites"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SecAggConfigError(f"secure-aggregation.roster {path}: unreadable ({exc!r})") \
            from None
    if not isinstance(sites, dict) or not sites:
        raise SecAggConfigError(f"secure-aggregation.roster {path}: 'sites' must be a table "
                                "of site name -> public key")
    roster = {}
    for name, text in sites.items():
        try:
            roster[name] = Ed25519PublicKey.from_public_bytes(base64.b64decode(text,
                                                                               validate=True))
        except (ValueError, TypeError, binascii.Error):
            raise SecAggConfigError(f"secure-aggregation.roster {path}: site {name!r} has no "
                                    "valid Ed25519 public key") from None
    texts = [public_text(k) for k in roster.values()]
    if len(set(texts)) != len(texts):
        raise SecAggConfigError(f"secure-aggregation.roster {path}: two sites share a key")
    return roster


def write_roster(path: Path, roster: Mapping[str, str]) -> None:
    """Write ``roster`` (site name -> :func:`public_text`) to ``path``, sorted by name, in
    one step (a reader sees the old roster or the new one, never part of one)."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps({"sites": dict(sorted(roster.items()))}, indent=2) + "\n",
                       encoding="utf-8")
    partial.replace(path)


def roster_fingerprint(roster: Mapping[str, Ed25519PublicKey]) -> str:
    """SHA-256 over the sorted names and keys: what hospitals compare out of band."""
    text = "\n".join(f"{name} {public_text(key)}" for name, key in sorted(roster.items()))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class SiteIdentity:
    """A site's long-term signing key, its name in the roster, and the roster it trusts."""

    name: str
    key: Ed25519PrivateKey
    roster: Mapping[str, Ed25519PublicKey]

    def __post_init__(self) -> None:
        mine = self.roster.get(self.name)
        if mine is None or public_text(mine) != public_text(self.key):
            raise SecAggConfigError(f"secure-aggregation.roster: site {self.name!r} is not in "
                                    "it with this site's signing key")

    @classmethod
    def load(cls, name: str, key_path: str | Path, roster_path: str | Path,
             read: Callable[[str | Path], bytes] | None = None) -> SiteIdentity:
        """The identity of site ``name`` from its policy's two files (``read``: how to get
        a file's bytes, :meth:`clients.site.site.Site.read_policy_file`; default: disk)."""
        read = read or (lambda path: Path(path).read_bytes())
        files = {}
        for rule, path in (("signing-key", key_path), ("roster", roster_path)):
            try:
                files[rule] = read(path)
            except OSError as exc:
                raise SecAggConfigError(f"secure-aggregation.{rule} {path}: unreadable "
                                        f"({type(exc).__name__})") from None
        return _parsed(cls, name, str(key_path), files["signing-key"], str(roster_path),
                       files["roster"])

    def sign(self, statement: bytes) -> bytes:
        """This site's signature of ``statement``."""
        return self.key.sign(statement)

    def verify(self, site: str, statement: bytes, signature: object) -> None:
        """Refuse (:class:`SecAggError` naming ``site``) a signature that is not ``site``'s
        roster key's on ``statement``, or a site the roster does not hold."""
        key = self.roster.get(site)
        if key is None:
            raise SecAggError(f"site {site!r} is not in this site's roster "
                              "(secure-aggregation.roster)")
        if not isinstance(signature, bytes) or len(signature) != SIGNATURE_BYTES:
            raise SecAggError(f"site {site!r}: the signature is missing or malformed")
        try:
            key.verify(signature, statement)
        except InvalidSignature:
            raise SecAggError(f"site {site!r}: the signature does not verify against its "
                              "roster key (a substituted key or survivor set)") from None


@functools.lru_cache(maxsize=32)
def _parsed(cls: type[SiteIdentity], name: str, key_path: str, key_data: bytes,
            roster_path: str, roster_data: bytes) -> SiteIdentity:
    """The identity of these exact files' bytes, parsed once per process (every stage of
    every round loads it; a changed file is a new entry)."""
    return cls(name, load_key(Path(key_path), key_data),
               load_roster(Path(roster_path), roster_data))
