"""The folder of a deployment (the same layout at every site).

Layout under the deployment folder (``make``: ``$(CURDIR)/deploy``)::

    certs/ca.crt, ca.key, superlink.crt, superlink.key     (app.tooling.certs)
    certs/sites/<site>/supernode.key, supernode.pub          (app.tooling.certs)
    superlink/state.db, superlink.log, superlink.stdout, sites.json, flwr-home/
    supernodes/<site>/supernode.log, state/, flwr-home/
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.tooling.certs import cert_paths, check_site_name, site_key_paths

__all__ = ["DeployLayout"]


@dataclass(frozen=True)
class DeployLayout:
    """Paths of one deployment folder (the same layout at every site)."""

    root: Path

    @property
    def certs(self) -> Path:
        """Folder of ``app.tooling.certs`` (CA, SuperLink certificate, site keys)."""
        return self.root / "certs"

    @property
    def ca_cert(self) -> Path:
        """The CA certificate every SuperNode and the CLI verify the SuperLink with."""
        return cert_paths(self.certs).ca_cert

    @property
    def superlink_dir(self) -> Path:
        """The SuperLink's database, logs and site registry."""
        return self.root / "superlink"

    @property
    def registry(self) -> Path:
        """``sites.json``: site name -> registered node id (Flower stores no names)."""
        return self.superlink_dir / "sites.json"

    def supernode_dir(self, site: str) -> Path:
        """A site's SuperNode log, default state folder and ``FLWR_HOME``."""
        return self.root / "supernodes" / check_site_name(site)

    def private_key(self, site: str) -> Path:
        """The site's SuperNode authentication private key (OpenSSH format)."""
        return site_key_paths(self.certs, site).private_key

    def public_key(self, site: str) -> Path:
        """The site's SuperNode authentication public key (OpenSSH line)."""
        return site_key_paths(self.certs, site).public_key
