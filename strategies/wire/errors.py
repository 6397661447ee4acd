"""The product's one exception root and its branches.

Every error the product raises on purpose derives from :class:`FedMedError`,
through exactly one of these branches, so a caller can tell what went wrong by
the branch alone:

- :class:`ConfigError` -- a run config, node config, site policy, plug-in option,
  codec spec or command-line value is wrong; the message names the key or file.
- :class:`SiteError` -- a site cannot do the work asked of it (its data is
  unusable, training diverged); the site answers with an error reply.
- :class:`ItemError` -- one item (study, radiograph, volume, manifest row) is
  unreadable; it is skipped and counted, the site goes on.
- :class:`ReplyError` -- a site's reply is malformed or untrustworthy; the
  server drops that reply with a logged reason, the round goes on.
- :class:`FederationError` -- the federation as a whole cannot go on (no valid
  replies, no nodes, a checkpoint that does not match, a Flower process that
  failed).

This module imports nothing: it is the one module of ``strategies`` that the
site side (``clients``) and ``models`` may import (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

__all__ = [
    "FedMedError",
    "ConfigError",
    "SiteError",
    "ItemError",
    "ReplyError",
    "FederationError",
]


class FedMedError(Exception):
    """Root of every error the product raises on purpose."""


class ConfigError(FedMedError, ValueError):
    """A configuration value is missing, of the wrong type or out of range."""


class SiteError(FedMedError, RuntimeError):
    """A site cannot do the work asked of it (data unusable, training failed)."""


class ItemError(FedMedError):
    """One data item is unreadable: it is skipped and counted, the site goes on."""


class ReplyError(FedMedError, ValueError):
    """A site's reply is malformed or untrustworthy: the server drops it."""


class FederationError(FedMedError, RuntimeError):
    """The federation as a whole cannot go on."""
