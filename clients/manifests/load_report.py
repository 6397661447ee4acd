"""Load a site's items one by one, skipping and counting the unreadable ones.

One bad item never stops a site: every :class:`~strategies.wire.errors.ItemError`
(a :class:`~clients.errors.StudyError` of any kind: an unreadable DICOM series,
mask, radiograph or volume, a bad label) raised while loading one manifest row
is caught, logged as one warning line ``Skipping <noun> <id>: <reason>`` and
recorded in the :class:`LoadReport`. Errors of the whole manifest
(:class:`~clients.errors.ManifestError`) propagate: then nothing at the site can
be trusted.

The report holds item ids and file paths: it is for the site's own logs and
must not be sent to the server (send only counts).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from strategies.wire.errors import ItemError

__all__ = ["LoadReport", "rows_of_split", "load_each"]

logger = logging.getLogger(__name__)

R = TypeVar("R")
T = TypeVar("T")


@dataclass
class LoadReport:
    """What a site loader loaded and skipped.

    Attributes
    ----------
    loaded : list of str
        Ids of the items loaded, in manifest order.
    skipped : dict of str to str
        Item id -> reason (the error message on one line, naming the file).
    """

    loaded: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def num_loaded(self) -> int:
        """Number of items loaded."""
        return len(self.loaded)

    @property
    def num_skipped(self) -> int:
        """Number of items skipped."""
        return len(self.skipped)

    def skip(self, item_id: str, error: Exception, noun: str = "study") -> None:
        """Record a skipped item and log it on one line."""
        reason = " ".join(str(error).splitlines())  # one line, whatever the underlying library wrote
        self.skipped[item_id] = reason
        logger.warning("Skipping %s %s: %s", noun, item_id, reason)


def rows_of_split(read_rows: Callable[[], Iterable[R]], split: str | None, splits: Sequence[str]) -> list[R]:
    """The manifest rows of ``split`` (all rows when ``None``); ``split`` is checked before reading.

    Raises
    ------
    ValueError
        If ``split`` is neither ``None`` nor one of ``splits``.
    ManifestError
        From ``read_rows``, if the manifest is missing or malformed.
    """
    if split is not None and split not in splits:
        raise ValueError(f"split must be one of {tuple(splits)} or None, got {split!r}")
    return [row for row in read_rows() if split is None or row.split == split]  # type: ignore[attr-defined]


def load_each(rows: Iterable[R], load: Callable[[R], T], item_id: Callable[[R], str],
              noun: str = "study") -> tuple[list[T], LoadReport]:
    """Load every row with ``load``, skipping (and reporting) the rows whose item is unreadable.

    Parameters
    ----------
    rows : iterable
        Manifest rows, in manifest order.
    load : callable
        Loads one row; raises an :class:`~strategies.wire.errors.ItemError` for an
        unusable item.
    item_id : callable
        The id of a row (for the report and the log line).
    noun : str, optional
        What an item is called in the log line (``study``, ``image``).

    Returns
    -------
    items : list
        The loaded items, in manifest order.
    report : LoadReport
        Loaded ids, and skipped ids with their reason.
    """
    items: list[T] = []
    report = LoadReport()
    for row in rows:
        try:
            item = load(row)
        except ItemError as exc:
            report.skip(item_id(row), exc, noun)
            continue
        items.append(item)
        report.loaded.append(item_id(row))
    return items, report
