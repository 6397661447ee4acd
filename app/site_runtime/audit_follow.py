"""The audit log verified as it grows: each record read and checked once (the console's view).

:func:`app.site_runtime.audit_chain.verify_chain` walks the whole log; a reader that
asks again and again (the console, after every new record) would pay for the whole log
each time. :class:`AuditFollower` keeps the verified prefix instead: the chain's walk
(the next seq and the hash it must link to) and, per segment verified, its identity
(device and inode, kept through a rotation's rename), the bytes and lines verified and
its last verified line. :meth:`AuditFollower.refresh` then reads, under the log's lock,
only the bytes appended since (and any new segment), and walks those records alone.

It verifies the whole log again, and says why in :attr:`FollowResult.reason`, when the
verified prefix is no longer what it verified: a segment gone or replaced (another
inode), shorter, a rotated segment whose size or mtime changed, a last verified line that
is not where it was, ``head.json`` naming an earlier record than the newest; and after
a broken chain. An edit of an already verified line that keeps every size and the last
line in place is seen by the next full pass (``make audit-verify`` is always one).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.site_runtime.audit_chain import (
    ChainBroken, ChainReport, ChainWalk, read_head, segment_lines,
)
from app.site_runtime.audit_format import CURRENT_NAME, HEAD_NAME, audit_dir, segment_paths
from app.site_runtime.audit_log import AuditLog

__all__ = ["AuditFollower", "FollowResult"]

#: Strings kept once for all records (keys, kinds, decisions, site and app names) at most.
INTERNED_MAX = 4096
#: The longest string value kept once.
INTERNED_LEN = 64
#: Keys whose values are unique to each record: never kept once.
UNIQUE_KEYS = frozenset({"hash", "prev", "time"})


class _Interner:
    """``json.loads`` that keeps each key and each repeated short value once (the first
    :data:`INTERNED_MAX` seen): a record the console holds costs about 1.5 KB, not 3.7 KB."""

    def __init__(self) -> None:
        self.memo: dict[str, str] = {}

    def loads(self, raw: bytes) -> Any:
        return json.loads(raw, object_pairs_hook=self._pairs)

    def _pairs(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        return {self._one(key): value if type(value) is not str or key in UNIQUE_KEYS
                else self._one(value) for key, value in pairs}

    def _one(self, text: str) -> str:
        if len(text) > INTERNED_LEN or (len(self.memo) >= INTERNED_MAX and text not in self.memo):
            return text
        return self.memo.setdefault(text, text)


@dataclass
class _Piece:
    """One segment as far as it was verified: its path when last seen, identity
    (device, inode), mtime, bytes and lines verified, and its last verified line."""

    path: Path
    ident: tuple[int, int]
    mtime: int
    end: int
    lines: int
    tail: bytes


@dataclass(frozen=True)
class FollowResult:
    """What one :meth:`AuditFollower.refresh` found.

    Attributes
    ----------
    records
        The records verified by this refresh: the new ones, or every one on a full pass
        (up to the first problem).
    full
        True when the log was verified from its first record.
    reason
        Why a full pass was needed after an earlier one ("" for the first, or none).
    report
        The chain's report, for the whole log.
    """

    records: list[dict[str, Any]]
    full: bool
    reason: str
    report: ChainReport


def _last_line(data: bytes) -> bytes:
    """The last line of ``data`` (which ends with a newline), newline included."""
    return data[data.rfind(b"\n", 0, len(data) - 1) + 1:] if data else b""


class AuditFollower:
    """The audit log of one state dir, verified incrementally (the module docstring).

    Parameters
    ----------
    state_dir
        The site's state dir.
    archive
        A folder the hospital moved rotated segments to, read as if in place.

    Attributes
    ----------
    parsed
        Records parsed since this follower was made (a refresh parses only new ones).
    """

    def __init__(self, state_dir: str | Path, archive: str | Path | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.folder = audit_dir(self.state_dir)
        self.archive = Path(archive) if archive is not None else None
        self.parsed = 0
        self._interner = _Interner()
        self._walk: ChainWalk | None = None
        self._pieces: list[_Piece] = []

    def refresh(self) -> FollowResult:
        """Verify what was appended since the last refresh (all of it the first time, or
        when the verified prefix changed); the records verified and the chain's report."""
        if self._walk is None:
            return self._full("")
        result, reason = self._continue(self._walk)
        return result if result is not None else self._full(reason)

    def _taken(self) -> tuple[bytes | None, list[tuple[Path, os.stat_result]]]:
        """``head.json``'s bytes and the segments in seq order (the state dir's copy where the
        archive holds one too), then the current one, each with its ``stat``; to be called
        under the log's lock."""
        try:
            head: bytes | None = (self.folder / HEAD_NAME).read_bytes()
        except FileNotFoundError:
            head = None
        found = dict(segment_paths(self.archive)) if self.archive is not None else {}
        found.update(segment_paths(self.folder))
        listing = []
        for path in [found[first] for first in sorted(found)] + [self.folder / CURRENT_NAME]:
            try:
                listing.append((path, path.stat()))
            except FileNotFoundError:
                continue
        return head, listing

    def _full(self, reason: str) -> FollowResult:
        """Verify the whole log (``reason``: why again, said in the report's note)."""
        self._walk, self._pieces = None, []
        walk = ChainWalk(loads=self._interner.loads)
        note = f"verified in full again: {reason}" if reason else ""
        records: list[dict[str, Any]] = []
        pieces = []
        with AuditLog(self.state_dir).reading():
            head, listing = self._taken()
            datas = [_read(path, info, 0) for path, info in listing]
        try:
            walk.head = read_head(head, self.folder / HEAD_NAME)
            for index, (path, info) in enumerate(listing):
                data, datas[index] = _readable(path, datas[index], walk.seq), b""
                found = walk.segment(segment_lines(path, data, walk.seq))
                records += found
                pieces.append(_Piece(path, (info.st_dev, info.st_ino), info.st_mtime_ns,
                                     len(data), len(found), _last_line(data)))
            walk.end(listing[-1][0] if listing else self.folder / CURRENT_NAME)
        except ChainBroken as broken:
            return FollowResult(records, True, reason, walk.report(broken, note))
        finally:
            self.parsed += walk.count
        self._walk, self._pieces = walk, pieces
        return FollowResult(records, True, reason, walk.report(note=note))

    def _continue(self, walk: ChainWalk) -> tuple[FollowResult | None, str]:
        """Verify only what was appended: ``(result, "")``, or ``(None, why a full pass is
        needed)``."""
        with AuditLog(self.state_dir).reading():
            head, listing = self._taken()
            reason = self._changed(listing)
            if reason:
                return None, reason
            first = max(len(self._pieces) - 1, 0)
            reads = [(path, info, _read(path, info, self._start(index)))
                     for index, (path, info) in enumerate(listing) if index >= first]
        records: list[dict[str, Any]] = []
        try:
            walk.head = read_head(head, self.folder / HEAD_NAME)
            if walk.head is not None and walk.head["seq"] < walk.seq - 1:
                return None, f"head.json names seq {walk.head['seq']}, before seq {walk.seq - 1}"
            for index, (path, info, data) in enumerate(reads, start=first):
                found = self._extend(walk, index, path, info, _readable(path, data, walk.seq))
                if found is None:
                    return None, f"the last verified line of {path.name} is not where it was"
                records += found
            walk.end(listing[-1][0] if listing else self.folder / CURRENT_NAME)
        except ChainBroken:
            return None, "the records appended since the last check do not verify"
        return FollowResult(records, False, "", walk.report()), ""

    def _changed(self, listing: list[tuple[Path, os.stat_result]]) -> str:
        """Why the verified pieces are no longer the first segments listed ("" if they are;
        the last verified piece may have grown)."""
        if len(listing) < len(self._pieces):
            return f"{self._pieces[len(listing)].path.name} is gone"
        for index, piece in enumerate(self._pieces):
            path, info = listing[index]
            if (info.st_dev, info.st_ino) != piece.ident:
                return f"{path.name} is another file than the one verified"
            grown = index == len(self._pieces) - 1
            if info.st_size < piece.end or (not grown and (info.st_size, info.st_mtime_ns)
                                            != (piece.end, piece.mtime)):
                return f"{path.name} changed after it was verified"
        return ""

    def _start(self, index: int) -> int:
        """Where to read segment ``index`` from: the last verified line of a verified one."""
        if index < len(self._pieces):
            return self._pieces[index].end - len(self._pieces[index].tail)
        return 0

    def _extend(self, walk: ChainWalk, index: int, path: Path, info: os.stat_result,
                data: bytes) -> list[dict[str, Any]] | None:
        """Walk segment ``index``'s new lines (``data``: from its last verified line on, or
        all of a new segment); its records, or None when the last verified line moved."""
        piece = self._pieces[index] if index < len(self._pieces) else \
            _Piece(path, (info.st_dev, info.st_ino), 0, 0, 0, b"")
        if not data.startswith(piece.tail):
            return None
        new = data[len(piece.tail):]
        found = walk.segment(segment_lines(path, new, walk.seq, piece.lines + 1))
        self.parsed += len(found)
        grown = _Piece(path, piece.ident, info.st_mtime_ns, piece.end + len(new),
                       piece.lines + len(found), _last_line(new) if new else piece.tail)
        if index < len(self._pieces):
            self._pieces[index] = grown
        else:
            self._pieces.append(grown)
        return found


def _read(path: Path, info: os.stat_result, offset: int) -> bytes | OSError:
    """The bytes of ``path`` from ``offset`` up to the size it had when listed (the error
    when it cannot be read, reported where the walk reaches it)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read(info.st_size - offset)
    except OSError as exc:
        return exc


def _readable(path: Path, data: bytes | OSError, seq: int) -> bytes:
    """``data``, or the segment named unreadable where the next seq due is ``seq``."""
    if isinstance(data, OSError):
        raise ChainBroken("unreadable", seq, None, f"cannot read the segment: {data}", file=path)
    return data
