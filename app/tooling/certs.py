"""TLS certificates and SuperNode authentication keys for a Flower deployment.

``python -m app.tooling.certs --out DIR --hosts localhost,127.0.0.1 --sites hospital-a,hospital-b``
writes, with the ``cryptography`` package:

``DIR/ca.crt``, ``DIR/ca.key``
    A private certificate authority (ECDSA P-384, self-signed, 10 years). Its
    certificate goes to every hospital (``flower-supernode --root-certificates``)
    and to the researchers' ``flwr`` CLI; its key stays at the coordinating site.
``DIR/superlink.crt``, ``DIR/superlink.key``
    The SuperLink's TLS server certificate, signed by the CA, with one
    SubjectAltName per ``--hosts`` entry (DNS names and IP addresses). A
    SuperNode refuses the SuperLink unless the address it dials is among them.
``DIR/sites/<site>/supernode.key``, ``DIR/sites/<site>/supernode.pub``
    One SuperNode authentication key pair per site (ECDSA P-384), in the formats
    Flower 1.41 loads: ``flower-supernode --auth-supernode-private-key`` reads an
    **OpenSSH private key** (``-----BEGIN OPENSSH PRIVATE KEY-----``, unencrypted)
    and ``flwr supernode register`` reads an **OpenSSH public key**
    (``ecdsa-sha2-nistp384 AAAA... <comment>``); both insist on a NIST EC curve.
    A hospital should generate its own pair (``--sites`` without ``--hosts``)
    and send only the ``.pub`` file to the coordinator.

Existing files are never overwritten unless ``--force`` (SuperLink certificate
and the named sites' keys) or ``--new-ca``: a second run with the same
arguments changes nothing, and a run asking for a server certificate with other
host names than the existing one stops with an error. Private keys are written
with mode 600 (their site folders 700).
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from strategies.rounds.site_book import site_name_problem
from strategies.wire.errors import ConfigError

__all__ = [
    "CertError",
    "CertPaths",
    "SiteKeyPaths",
    "cert_paths",
    "site_key_paths",
    "ensure_ca",
    "ensure_server_certificate",
    "ensure_site_keys",
    "parse_hosts",
]

CA_DAYS = 3650
SERVER_DAYS = 825
_CURVE = ec.SECP384R1


class CertError(ConfigError):
    """A certificate or key cannot be created, or an existing one does not fit."""


@dataclass(frozen=True)
class CertPaths:
    """Where the CA and the SuperLink's TLS certificate live under ``out``."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path


@dataclass(frozen=True)
class SiteKeyPaths:
    """A site's SuperNode authentication key pair."""

    private_key: Path
    public_key: Path


def cert_paths(out: Path) -> CertPaths:
    """The CA and server certificate paths under ``out``."""
    return CertPaths(ca_cert=out / "ca.crt", ca_key=out / "ca.key",
                     server_cert=out / "superlink.crt", server_key=out / "superlink.key")


def site_key_paths(out: Path, site: str) -> SiteKeyPaths:
    """The key pair of ``site`` under ``out/sites/<site>/``."""
    check_site_name(site)
    folder = out / "sites" / site
    return SiteKeyPaths(private_key=folder / "supernode.key",
                        public_key=folder / "supernode.pub")


def check_site_name(site: str) -> str:
    """Return ``site`` if it passes the product's one site-name rule
    (:func:`strategies.rounds.site_book.site_name_problem`)."""
    problem = site_name_problem(site)
    if problem is not None:
        raise CertError(f"invalid site name: {problem}")
    return site


def parse_hosts(hosts: str) -> list[x509.GeneralName]:
    """SubjectAltNames for a comma-separated list of host names and IP addresses."""
    names: list[x509.GeneralName] = []
    for raw in hosts.split(","):
        host = raw.strip()
        if not host:
            continue
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            if not re.fullmatch(r"[A-Za-z0-9*]([A-Za-z0-9.-]*[A-Za-z0-9])?", host):
                raise CertError(f"invalid host name {host!r} in --hosts") from None
            names.append(x509.DNSName(host))
    if not names:
        raise CertError("--hosts names no host; e.g. --hosts localhost,127.0.0.1")
    return names


# --- file helpers -------------------------------------------------------------------


def _write(path: Path, data: bytes, private: bool) -> None:
    """Write ``data`` atomically; private files are created with mode 600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o600 if private else 0o644)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _load_pem_key(path: Path) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise CertError(f"cannot read the private key {path}: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertError(f"{path} is not an EC private key")
    return key


def _load_cert(path: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise CertError(f"cannot read the certificate {path}: {exc}") from exc


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _check_pair(what: str, first: Path, second: Path) -> bool:
    """True if both exist, False if neither; a half-present pair is an error."""
    exists = first.exists(), second.exists()
    if all(exists):
        return True
    if any(exists):
        present, missing = (first, second) if exists[0] else (second, first)
        raise CertError(f"{what}: {present} exists but {missing} does not; restore it "
                        "or regenerate both (--force; --new-ca for the CA)")
    return False


# --- CA and server certificate --------------------------------------------------------


def ensure_ca(out: Path, force: bool = False, common_name: str = "fedmed deployment CA"
              ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, bool]:
    """Load the CA under ``out``, or create it. Returns (cert, key, created)."""
    paths = cert_paths(out)
    if not force and _check_pair("CA", paths.ca_cert, paths.ca_key):
        cert, key = _load_cert(paths.ca_cert), _load_pem_key(paths.ca_key)
        if cert.public_key().public_numbers() != key.public_key().public_numbers():
            raise CertError(f"{paths.ca_key} is not the key of {paths.ca_cert}")
        return cert, key, False
    key = ec.generate_private_key(_CURVE())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True,
            content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA384())
    )
    _write(paths.ca_key, _pem_key(key), private=True)
    _write(paths.ca_cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return cert, key, True


def _san_set(names: Sequence[x509.GeneralName]) -> set[str]:
    return {f"{type(n).__name__}:{n.value}" for n in names}


def ensure_server_certificate(out: Path, hosts: str, force: bool = False,
                              new_ca: bool = False) -> bool:
    """Create the SuperLink's TLS certificate for ``hosts``, signed by the CA.

    The CA is created when missing and kept otherwise: ``force`` replaces only
    the server certificate (hospitals keep their ``ca.crt``); ``new_ca`` also
    replaces the CA (every hospital then needs the new ``ca.crt``).
    Returns True if the certificate was created, False if a matching one existed.

    Raises
    ------
    CertError
        If an existing certificate names other hosts (``--force`` replaces it) or
        was not signed by the CA under ``out``.
    """
    paths = cert_paths(out)
    wanted = parse_hosts(hosts)
    ca_cert, ca_key, ca_created = ensure_ca(out, force=new_ca)
    if not force and not ca_created and _check_pair(
            "SuperLink certificate", paths.server_cert, paths.server_key):
        cert = _load_cert(paths.server_cert)
        key = _load_pem_key(paths.server_key)
        if cert.public_key().public_numbers() != key.public_key().public_numbers():
            raise CertError(f"{paths.server_key} is not the key of {paths.server_cert}")
        if cert.issuer != ca_cert.subject:
            raise CertError(f"{paths.server_cert} was not issued by {paths.ca_cert}; "
                            "regenerate with --force")
        existing = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        have = _san_set(list(existing))
        if have != _san_set(wanted):
            raise CertError(
                f"{paths.server_cert} already exists for {sorted(have)}, not for "
                f"{sorted(_san_set(wanted))}; rerun with --force to replace it (then "
                "restart the SuperLink; hospitals keep the same ca.crt)")
        return False
    key = ec.generate_private_key(_CURVE())
    first = wanted[0].value
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(first))]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=SERVER_DAYS))
        .add_extension(x509.SubjectAlternativeName(wanted), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_encipherment=False, key_cert_sign=False,
            crl_sign=False, content_commitment=False, data_encipherment=False,
            key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                       critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
            ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    _write(paths.server_key, _pem_key(key), private=True)
    _write(paths.server_cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return True


# --- SuperNode authentication keys ----------------------------------------------------


def _load_site_private_key(path: Path) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_ssh_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise CertError(f"cannot read the SuperNode key {path} (Flower needs an "
                        f"unencrypted OpenSSH EC private key): {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertError(f"{path} is not an EC key; Flower needs a NIST EC curve key")
    return key


def ensure_site_keys(out: Path, site: str, force: bool = False) -> bool:
    """Create the SuperNode authentication key pair of ``site``; True if created.

    The private key is an unencrypted OpenSSH EC private key (what
    ``flower-supernode --auth-supernode-private-key`` loads), the public key
    an OpenSSH ``ecdsa-sha2-nistp384`` line (what ``flwr supernode register``
    loads), commented with the site name.
    """
    paths = site_key_paths(out, site)
    if not force and _check_pair(f"site {site}", paths.private_key, paths.public_key):
        key = _load_site_private_key(paths.private_key)
        try:
            public = serialization.load_ssh_public_key(paths.public_key.read_bytes())
        except (OSError, ValueError) as exc:
            raise CertError(f"cannot read {paths.public_key}: {exc}") from exc
        if not isinstance(public, ec.EllipticCurvePublicKey) or \
                public.public_numbers() != key.public_key().public_numbers():
            raise CertError(f"{paths.public_key} does not match {paths.private_key}")
        return False
    key = ec.generate_private_key(_CURVE())
    private = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH)
    _write(paths.private_key, private, private=True)
    _write(paths.public_key, public + f" {site}\n".encode(), private=False)
    os.chmod(paths.private_key.parent, 0o700)
    return True


# --- CLI ------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(
        description="Create the deployment CA, the SuperLink's TLS certificate and "
                    "SuperNode authentication keys (existing files are kept).")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--hosts", default=None,
                        help="comma-separated host names / IPs the SuperLink is reached "
                             "at (SubjectAltNames), e.g. localhost,127.0.0.1; creates the "
                             "CA and the SuperLink certificate")
    parser.add_argument("--sites", default=None,
                        help="comma-separated site names; creates one SuperNode key pair "
                             "each under OUT/sites/<site>/")
    parser.add_argument("--force", action="store_true",
                        help="replace the SuperLink certificate and the site keys named by "
                             "this call (the CA is kept)")
    parser.add_argument("--new-ca", action="store_true",
                        help="also replace the CA (hospitals then need the new ca.crt)")
    args = parser.parse_args(argv)
    if args.hosts is None and args.sites is None:
        parser.error("give --hosts (CA + SuperLink certificate) and/or --sites (site keys)")
    out = args.out.resolve()
    try:
        if args.hosts is not None:
            created = ensure_server_certificate(out, args.hosts, force=args.force,
                                                new_ca=args.new_ca)
            paths = cert_paths(out)
            state = "created" if created else "kept: already there"
            print(f"CA certificate      {paths.ca_cert}")
            print(f"SuperLink TLS cert  {paths.server_cert} for {args.hosts} ({state})")
        for site in [s.strip() for s in (args.sites or "").split(",") if s.strip()]:
            created = ensure_site_keys(out, site, force=args.force)
            paths = site_key_paths(out, site)
            state = "created" if created else "kept: already there"
            print(f"site {site:<14} {paths.public_key} + private key ({state})")
    except CertError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
