"""Verify the site's audit log: every hash, every link, every seq; name the first bad record.

``make audit-verify STATE=/abs/state [ARCHIVE=/abs/folder]``, or::

    python -m app.site_runtime.audit_chain --state DIR [--archive DIR] [--expect-head [SEQ:]HEX]

walks the rotated segments of ``<state-dir>/audit/`` (and of the archive folder the
hospital moved old segments to) in seq order, then ``audit.jsonl``, recomputing each
record's hash (:func:`app.site_runtime.audit_format.record_hash`) and its link to the
previous one. The log's files are taken under its lock
(:meth:`~app.site_runtime.audit_log.AuditLog.snapshot`): a log the site is writing
verifies. It prints ``audit log OK: N records, head <hash>`` (exit 0) or the first
problem in one line, ``file:line``, seq and what happened (exit 1); a missing folder
exits 2.

What each problem means:

- ``edited``: a record's hash does not match its content; or the editor recomputed that
  hash, which breaks the next record's link (the edited record is the one named), or
  no longer matches ``head.json`` or the expected head;
- ``removed``: a seq is missing (a deleted line, a deleted segment, the first records);
- ``reordered``: a seq comes before a smaller one;
- ``truncated``: ``head.json`` names a later record than the last one, or the last line
  is torn (no newline);
- ``unreadable``: a line is not a JSON object with ``seq``, ``prev`` and ``hash``, or a
  segment cannot be read.

The chain proves the log was not edited *in place*. Someone able to write the folder
could still rewrite the whole chain from an early record on (recomputing every hash and
``head.json``): only a head archived elsewhere earlier (``--expect-head``, the
``head <hash>`` of a past OK line, best with its seq as ``SEQ:HEX``) catches that.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.site_runtime.audit_format import (
    CURRENT_NAME, GENESIS, HEAD_NAME, audit_dir, record_hash, segment_paths,
)
from app.site_runtime.audit_log import AuditLog, AuditLogError, LogSnapshot

__all__ = ["ChainReport", "verify_chain", "main"]

HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ChainReport:
    """The outcome of :func:`verify_chain`.

    Attributes
    ----------
    ok
        True when every record, link and seq checks out.
    records
        Records read in order before the first problem (all of them when ``ok``).
    head_hash
        Hash of the last good record (:data:`~app.site_runtime.audit_format.GENESIS` if none).
    problem
        ``"edited"``, ``"removed"``, ``"reordered"``, ``"truncated"`` or ``"unreadable"``.
    seq, file, line
        The first bad record: its seq (or the missing one's), its file and 1-based line.
    detail
        What was found, in words.
    """

    ok: bool
    records: int
    head_hash: str
    problem: str | None = None
    seq: int | None = None
    file: str | None = None
    line: int | None = None
    detail: str = ""

    def message(self) -> str:
        """One line: the OK summary, or the first bad record's place, seq and problem."""
        if self.ok:
            return f"audit log OK: {self.records} records, head {self.head_hash}"
        where = f"{self.file}:{self.line}" if self.line is not None else str(self.file)
        seq = f"seq {self.seq}" if self.seq is not None else "no seq"
        return f"audit log BROKEN at {where} ({seq}): {self.problem}: {self.detail}"


@dataclass(frozen=True)
class _Line:
    """One line of a segment: its file, 1-based number, bytes, and whether it is torn."""

    file: Path
    number: int
    raw: bytes
    torn: bool


class _Broken(AuditLogError):
    """The first problem found: raised out of the walk, turned into a :class:`ChainReport`."""

    def __init__(self, problem: str, seq: int | None, place: _Line | None, detail: str,
                 file: Path | None = None) -> None:
        super().__init__(detail)
        self.problem, self.seq, self.place, self.detail = problem, seq, place, detail
        self.file = place.file if place is not None else file
        #: ``(records, head hash)`` of the good chain when it ends before the walk's position.
        self.good: tuple[int, str] | None = None


def _segments(snapshot: LogSnapshot, folder: Path,
              archive: Path | None) -> list[tuple[Path, bytes | None]]:
    """``(path, bytes)`` of the rotated segments (the state dir's copy where the archive holds
    one too; bytes None: read when walked) in seq order, then the current segment's."""
    found = dict(segment_paths(archive)) if archive is not None else {}
    found.update(snapshot.rotated)
    segments: list[tuple[Path, bytes | None]] = [(found[first], None) for first in sorted(found)]
    if snapshot.current:
        segments.append((folder / CURRENT_NAME, snapshot.current))
    return segments


def _lines(path: Path, data: bytes | None, seq: int) -> list[_Line]:
    """The lines of one segment (``data``, else read from ``path``); the next seq due is
    ``seq`` (named when the file cannot be read, e.g. moved away while verified)."""
    if data is None:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise _Broken("unreadable", seq, None, f"cannot read the segment: {exc}",
                          file=path) from exc
    parts = data.split(b"\n")
    lines = [_Line(path, number, raw, False) for number, raw in enumerate(parts[:-1], start=1)]
    if parts[-1]:
        lines.append(_Line(path, len(parts), parts[-1], True))
    return lines


def _parse(line: _Line) -> dict[str, Any]:
    if line.torn:
        raise _Broken("truncated", None, line, "the last line is torn (no newline)")
    try:
        record = json.loads(line.raw)
    except ValueError as exc:
        raise _Broken("unreadable", None, line, f"not JSON: {exc}") from exc
    if not (isinstance(record, dict) and type(record.get("seq")) is int
            and isinstance(record.get("prev"), str) and isinstance(record.get("hash"), str)):
        raise _Broken("unreadable", None, line, "not a record with seq, prev and hash")
    return record


def _read_head(raw: bytes | None, path: Path) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        head = json.loads(raw)
    except ValueError as exc:
        raise _Broken("unreadable", None, None, f"head.json: {exc}", file=path) from exc
    if not (isinstance(head, dict) and type(head.get("seq")) is int
            and isinstance(head.get("hash"), str)):
        raise _Broken("unreadable", None, None, "head.json is not {seq, hash}", file=path)
    return head


def _expected(expect_head: str | None) -> tuple[int | None, str] | None:
    if expect_head is None:
        return None
    seq, _, digest = expect_head.rpartition(":")
    if (seq and not seq.isdigit()) or not HEX64.fullmatch(digest.lower()):
        raise AuditLogError(f"--expect-head {expect_head!r}: not HEX or SEQ:HEX "
                            "(a SHA-256 in 64 hex digits)")
    return (int(seq) if seq else None), digest.lower()


class _Walk:
    """The chain walked record by record: the seq and hash each next record must link to."""

    def __init__(self, head: dict[str, Any] | None,
                 expect: tuple[int | None, str] | None) -> None:
        self.seq, self.hash, self.count = 0, GENESIS, 0
        self.previous: tuple[_Line, dict[str, Any]] | None = None
        self.head, self.expect, self.expect_seen = head, expect, False

    def segment(self, lines: list[_Line]) -> None:
        """Walk one segment's lines (a line that does not parse fails where it stands)."""
        parsed: list[tuple[_Line, dict[str, Any] | _Broken]] = []
        for line in lines:
            try:
                parsed.append((line, _parse(line)))
            except _Broken as broken:
                parsed.append((line, broken))
        for index, (line, record) in enumerate(parsed):
            if isinstance(record, _Broken):
                record.seq = self.seq
                raise record
            self.record(line, record, parsed[index + 1:])

    def record(self, line: _Line, record: dict[str, Any],
               later: Sequence[tuple[_Line, dict[str, Any] | _Broken]] = ()) -> None:
        """Check one record against its own hash, the chain so far and the anchors;
        ``later``: the segment's lines after it (a missing seq found there was moved)."""
        seq = record["seq"]
        if record_hash(record) != record["hash"]:
            raise _Broken("edited", seq, line, "the record's hash does not match its content")
        if seq != self.seq:
            if record["prev"] == self.hash:
                raise _Broken("edited", seq, line, f"seq {seq} where seq {self.seq} belongs "
                              "(its seq was changed and its hash recomputed)")
            if seq < self.seq:
                raise _Broken("reordered", seq, line,
                              f"seq {seq} comes after seq {self.seq - 1}")
            if any(isinstance(item, dict) and item["seq"] == self.seq for _, item in later):
                raise _Broken("reordered", seq, line, f"seq {seq} comes before seq {self.seq}")
            missing = f"seq {self.seq}" if seq == self.seq + 1 else f"seqs {self.seq}..{seq - 1}"
            raise _Broken("removed", self.seq, line, f"{missing} missing before seq {seq}")
        if record["prev"] != self.hash:
            if self.previous is None:
                raise _Broken("edited", seq, line, "the first record's prev is not the genesis")
            place, earlier = self.previous
            broken = _Broken("edited", earlier["seq"], place,
                             f"its hash was recomputed: seq {seq}'s link no longer matches it")
            broken.good = (self.count - 1, earlier["prev"])
            raise broken
        for digest, what in self._anchors(seq):
            if record["hash"] != digest:
                raise _Broken("edited", seq, line, f"its hash is not the one {what} recorded")
        if self.expect is not None and self.expect == (None, record["hash"]):
            self.expect_seen = True
        self.seq, self.hash, self.count = seq + 1, record["hash"], self.count + 1
        self.previous = (line, record)

    def _anchors(self, seq: int) -> Iterator[tuple[str, str]]:
        """The hashes recorded elsewhere for ``seq``: head.json's, the expected head's."""
        if self.head is not None and self.head["seq"] == seq:
            yield self.head["hash"], "head.json"
        if self.expect is not None and self.expect[0] == seq:
            self.expect_seen = True
            yield self.expect[1], "--expect-head"

    def end(self, last_file: Path) -> None:
        """Check the chain reaches head.json's record and the expected head."""
        place = self.previous[0] if self.previous is not None else None
        line = place.number + 1 if place is not None else 1
        tail = _Line(place.file if place else last_file, line, b"", False)
        if self.head is not None and self.head["seq"] >= self.seq:
            raise _Broken("truncated", self.seq, tail,
                          f"head.json names seq {self.head['seq']}, the log ends at "
                          f"seq {self.seq - 1}")
        if self.expect is not None and not self.expect_seen:
            expect_seq, digest = self.expect
            if expect_seq is not None and expect_seq >= self.seq:
                raise _Broken("truncated", self.seq, tail,
                              f"the expected head is seq {expect_seq}, the log ends at "
                              f"seq {self.seq - 1}")
            raise _Broken("edited", expect_seq, None,
                          f"no record has the expected head {digest}: the chain was rewritten",
                          file=last_file)


def verify_chain(state_dir: str | Path, archive: str | Path | None = None,
                 expect_head: str | None = None) -> ChainReport:
    """Check the audit log of ``state_dir``; report the first edited, removed, reordered,
    truncated or unreadable record.

    Parameters
    ----------
    state_dir
        The site's state dir (its ``audit/`` folder is read; none yet: an empty, OK log).
    archive
        A folder the hospital moved rotated segments to; they are read as if in place.
    expect_head
        A head archived elsewhere earlier, ``HEX`` or ``SEQ:HEX``: the chain must hold
        it (at that seq). The only defence against a rewrite of the whole chain, which
        leaves every hash, link and ``head.json`` consistent.

    Raises
    ------
    AuditLogError
        ``state_dir`` or ``archive`` is not a folder, or ``expect_head`` is malformed
        (a segment that cannot be read is reported as ``unreadable``).
    """
    state = Path(state_dir)
    if not state.is_dir():
        raise AuditLogError(f"audit-verify: state dir {state}: no such folder")
    if archive is not None and not Path(archive).is_dir():
        raise AuditLogError(f"audit-verify: archive {archive}: no such folder")
    folder = audit_dir(state)
    walk = _Walk(None, _expected(expect_head))
    snapshot = AuditLog(state).snapshot()
    try:
        walk.head = _read_head(snapshot.head, folder / HEAD_NAME)
        segments = _segments(snapshot, folder, Path(archive) if archive is not None else None)
        for path, data in segments:
            walk.segment(_lines(path, data, walk.seq))
        walk.end(segments[-1][0] if segments else folder / CURRENT_NAME)
    except _Broken as broken:
        records, head_hash = broken.good or (walk.count, walk.hash)
        return ChainReport(False, records, head_hash, broken.problem, broken.seq,
                           str(broken.file), broken.place.number if broken.place else None,
                           broken.detail)
    return ChainReport(True, walk.count, walk.hash)


def main(argv: Sequence[str] | None = None) -> int:
    """Verify and print one line; 0 when OK, 1 when broken, 2 for a missing folder."""
    parser = argparse.ArgumentParser(prog="python -m app.site_runtime.audit_chain",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--state", required=True, help="the site's state dir")
    parser.add_argument("--archive", help="a folder holding rotated segments moved away")
    parser.add_argument("--expect-head", help="a head archived earlier: HEX or SEQ:HEX")
    args = parser.parse_args(argv)
    try:
        report = verify_chain(args.state, args.archive, args.expect_head)
    except AuditLogError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(report.message())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
