"""The errors of the PACS data source, on the product's one exception root.

- :class:`CohortError` (a :class:`~strategies.wire.errors.ConfigError`): the cohort file
  or its label CSV is wrong; the message names the file and the key (or line).
- :class:`PacsError` (a :class:`~strategies.wire.errors.SiteError`): the PACS cannot be
  used at all (down, refusing the credentials or the AE title, answering errors after
  every retry); the sync stops, nothing already synced is lost. Its :class:`Transient`
  branch is what is retried with back-off first, and :class:`Unreachable` the transient
  failure of a PACS that does not answer at all (a store of results then stops at once).
- :class:`StudySkipped` (an :class:`~strategies.wire.errors.ItemError`): one study cannot
  join the cohort (no matching series, missing label, gaps in the slices, unsupported
  transfer syntax); it is skipped with that one reason and counted in the load report.
"""

from __future__ import annotations

from strategies.wire.errors import ConfigError, ItemError, SiteError

__all__ = ["CohortError", "PacsError", "Transient", "Unreachable", "StudySkipped"]


class CohortError(ConfigError):
    """A cohort file (or the label CSV it names) is missing, malformed or inconsistent."""


class PacsError(SiteError):
    """The PACS cannot be reached or refuses the sync; the message names the endpoint."""


class Transient(PacsError):
    """A failure worth retrying (refused connection, timeout, server error, aborted
    association); :func:`~clients.pacs.transport.with_retries` retries it, then raises it
    as a plain :class:`PacsError`."""


class Unreachable(Transient):
    """A PACS that does not answer at all (refused connection, no association): retried as
    any :class:`Transient`; the store of results stops after it (the rest stay local)."""


class StudySkipped(ItemError):
    """One study is left out of the cohort, for one reason (its message)."""
