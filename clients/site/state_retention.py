"""Per-federation site state expires: the rule that keeps a site's state dir from growing.

A site keeps what a federation needs across restarts in
``<state-dir>/<federation>/`` (:class:`~clients.site.state_store.SiteStateStore`:
the error-feedback residual, the last global model, FedBN's local layers), about one model in size per federation, and the coordinator
chooses federation ids. The rule (node option ``state-retention-days``, default
:data:`DEFAULT_RETENTION_DAYS`; 0 keeps everything), applied when the site node
starts and before each run:

* a folder ``<state-dir>/<name>/`` is removed when the product wrote it (it holds
  only the state store's files, ``*.npy``, a SecAgg+ round a dropped site never
  finished (:data:`~clients.site.secure_state.STATE_FILE`, its secrets with it) and
  the ``*.tmp`` of an interrupted write, no folder, no link) and nothing in it was
  modified for more than ``state-retention-days`` days;
* never removed: ``<state-dir>/privacy/`` (the privacy ledgers,
  :mod:`clients.site.privacy_ledger`), the decoded-data cache
  (:data:`~clients.site.decoded_cache.CACHE_DIR_NAME`), and any folder holding
  something else (nothing the product did not create is deleted).

A federation resumed after its state expired starts that state afresh: its next
downlink is a dense snapshot, its error-feedback residual is zero (its privacy cost
and its request counts do not restart: the ledger and the counts are per dataset).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from clients.site.decoded_cache import CACHE_DIR_NAME
from clients.site.privacy_ledger import PRIVACY_DIR
from clients.site.secure_state import STATE_FILE

__all__ = ["DEFAULT_RETENTION_DAYS", "expire_federation_states"]

#: Days a federation's state folder is kept after its last change (node option default).
DEFAULT_RETENTION_DAYS = 30.0
#: Folders of the state dir that no retention rule removes.
_KEPT = frozenset({PRIVACY_DIR, CACHE_DIR_NAME})
#: What the state store writes: arrays, and the temporary file of an interrupted write.
_STATE_SUFFIXES = frozenset({".npy", ".tmp"})
_DAY_S = 86400.0


def _state_files(folder: Path) -> list[Path] | None:
    """The files of a folder the state store wrote, or None when it holds anything else."""
    entries = list(folder.iterdir())
    if not entries or any(e.is_symlink() or not e.is_file()
                          or (e.suffix not in _STATE_SUFFIXES and e.name != STATE_FILE)
                          for e in entries):
        return None
    return entries


def expire_federation_states(state_dir: Path, retention_days: float,
                             now: float | None = None) -> list[Path]:
    """Remove the federation state folders untouched for more than ``retention_days`` days.

    Parameters
    ----------
    state_dir : Path
        The site's state dir (node_config ``state-dir``); a missing one holds nothing.
    retention_days : float
        Node option ``state-retention-days``; 0 keeps every folder.
    now : float, optional
        The time (seconds since the epoch) ages are measured at; default now.

    Returns
    -------
    list of Path
        The folders removed, sorted.

    Raises
    ------
    ValueError
        ``retention_days`` is negative (names the option).
    """
    if retention_days < 0:
        raise ValueError(f"state-retention-days must be >= 0 (0 keeps all), got {retention_days}")
    state_dir = Path(state_dir)
    if retention_days == 0 or not state_dir.is_dir():
        return []
    oldest = (time.time() if now is None else now) - retention_days * _DAY_S
    removed = []
    for folder in sorted(state_dir.iterdir()):
        if folder.name in _KEPT or folder.is_symlink() or not folder.is_dir():
            continue
        files = _state_files(folder)
        if files is None:
            continue
        if max(path.stat().st_mtime for path in [folder, *files]) < oldest:
            shutil.rmtree(folder)
            removed.append(folder)
    return removed
