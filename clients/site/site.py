"""The site a round runs at: its name, data, state dir, policy and step cap (no Flower).

The ClientApp adapter builds it from the SuperNode's node_config
(:meth:`app.config.site_config.SiteConfig.site`, which reads the policy file);
a test or a benchmark builds it directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clients.site.policy import SitePolicy

__all__ = ["Site"]


@dataclass(frozen=True)
class Site:
    """One hospital as its round sees it: node_config values and its policy, read."""

    #: The site's name (node_config ``site-name``): its replies and its seeds carry it.
    name: str
    #: The site folder (``manifest.csv`` and the studies).
    data_path: Path
    #: Where what outlives a process is kept (residuals, ledger, FedBN layers, last model).
    state_dir: Path
    #: The hospital's rules, checked before any data is read.
    policy: SitePolicy
    #: Whether decoded data is cached under ``state_dir``.
    cache_decoded: bool = True
    #: node_config ``local-steps-cap``: the site's compute budget on tau (0 = none); a
    #: longer request is trained to the cap (the policy's ``max-local-steps`` refuses it).
    local_steps_cap: int = 0
    #: The hospital's site runtime charged the privacy ledger before this process saw the
    #: message (node_config ``privacy-ledger = "site-runtime"``, set by the runtime only):
    #: the round neither reads nor writes a ledger, and the runtime adds the reply's epsilon.
    runtime_ledger: bool = False
    #: The files the policy names (``secure-aggregation.roster`` and ``signing-key``,
    #: ``vertical.psi-secret``) as the hospital's runtime read them for its sandboxed
    #: worker, which cannot read them itself (node_config ``policy-files``): (path, bytes).
    policy_files: tuple[tuple[str, bytes], ...] = ()

    def read_policy_file(self, path: str | Path) -> bytes:
        """The bytes of ``path``, a file the policy names: as the runtime handed it over,
        else read from disk (OSError when neither has it)."""
        handed = dict(self.policy_files)
        return handed[str(path)] if str(path) in handed else Path(path).read_bytes()
