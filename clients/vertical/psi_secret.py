"""The PSI salt: a secret the federation's sites share and the coordinator never learns.

Each item of the private set intersection (clients/vertical/psi.py) is a keyed hash of a
patient id, HMAC-SHA256 (Bellare, Canetti & Krawczyk, CRYPTO 1996; RFC 2104) under this
secret. A salt the coordinator chooses or knows (the federation name, as before issue #46)
lets it hash guessed ids itself, send them as a forged ``psi-step`` request and read
which of them a site holds; under a key it never sees, its forged items match nothing
(the PRF property of HMAC).

Where the secret comes from:

- a site policy *file* names it (``[vertical] psi-secret``, an absolute path): the file's
  bytes are the key; the hospitals of one vertical federation hold the same file, made
  once by one of them (``make psi-secret PSI_SECRET=/abs/file``) and passed to the
  others over their own channel, never through the coordinator (docs/VERTICAL.md,
  "What the coordinator can and cannot learn from the PSI"). A policy file that names
  none, or a file that is unreadable or shorter than :data:`MIN_SECRET_BYTES`, refuses
  the PSI under ``vertical.psi-secret``;
- simulation (the permissive policy, no policy file): the simulated hospitals share one
  secret beside their data folders, ``<data-root>/.fedmed-psi-secret``, made on first use
  under a lock (mode 0600, :data:`SECRET_BYTES` random bytes), so simulated federations
  align exactly as deployed ones (clients/site/secure_identity.py does the same for the
  SecAgg+ keys).
"""

from __future__ import annotations

import fcntl
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from clients.site.policy import PolicyRefusal, SitePolicy
from clients.site.site import Site

__all__ = ["MIN_SECRET_BYTES", "SECRET_BYTES", "SECRET_RULE", "SIMULATION_SECRET",
           "create_secret", "load_secret", "site_secret"]

#: The policy rule a missing or unusable secret breaks.
SECRET_RULE = "vertical.psi-secret"
#: The fewest bytes a secret file may hold (128 bits).
MIN_SECRET_BYTES = 16
#: The bytes of a secret this module makes (256 bits, the output size of SHA-256).
SECRET_BYTES = 32
#: The simulation's shared secret, in the folder that holds the simulated sites' folders.
SIMULATION_SECRET = ".fedmed-psi-secret"


def create_secret(path: Path) -> bool:
    """Write :data:`SECRET_BYTES` random bytes to ``path`` (mode 0600) unless it exists.

    Returns
    -------
    bool
        True if the file was made, False if one was there (it is never overwritten).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    try:
        os.fchmod(descriptor, 0o600)
        os.write(descriptor, secrets.token_bytes(SECRET_BYTES))
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    return True


def load_secret(path: str | Path, read: Callable[[str | Path], bytes] | None = None) -> bytes:
    """The secret key in ``path``, its bytes as they are (``read``: how to get a file's
    bytes, :meth:`clients.site.site.Site.read_policy_file`; default: from disk).

    Raises
    ------
    PolicyRefusal
        Rule ``vertical.psi-secret``: the file is unreadable or shorter than
        :data:`MIN_SECRET_BYTES` (the detail never names the path).
    """
    try:
        secret = read(path) if read is not None else Path(path).read_bytes()
    except OSError as error:
        raise PolicyRefusal(SECRET_RULE, f"the PSI secret file is unreadable "
                                         f"({type(error).__name__})") from None
    if len(secret) < MIN_SECRET_BYTES:
        raise PolicyRefusal(SECRET_RULE, f"the PSI secret file holds {len(secret)} bytes, "
                                         f"fewer than {MIN_SECRET_BYTES}")
    return secret


def _simulation_secret(data_path: Path) -> bytes:
    path = Path(data_path).resolve().parent / SIMULATION_SECRET
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f"{SIMULATION_SECRET}.lock", "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            create_secret(path)
            return load_secret(path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def site_secret(site: Site) -> bytes:
    """The PSI secret of ``site``: its policy's file, or the simulation's shared one.

    Raises
    ------
    PolicyRefusal
        Rule ``vertical.psi-secret``: a policy file that names no secret, or a secret
        file that is unreadable or too short.
    """
    named = site.policy.vertical.psi_secret
    if named:  # as the site runtime handed it to its sandboxed worker, else from disk
        return load_secret(named, site.read_policy_file)
    if site.policy == SitePolicy.permissive():
        return _simulation_secret(Path(site.data_path))
    raise PolicyRefusal(SECRET_RULE, "the site's policy names no PSI secret; the federation "
                        "name alone is a salt the coordinator knows (it could probe which "
                        "patients the site holds)")
