"""Verify the site's audit log: every hash, every link, every seq, every anchor; name the
first bad record.

``make audit-verify STATE=/abs/state POLICY=/abs/policy.toml [ARCHIVE=/abs/folder]``, or::

    python -m app.site_runtime.audit_chain --state DIR [--policy FILE | --anchor SOURCE]
        [--journal FILE] [--archive DIR] [--expect-head [SEQ:]HEX]

walks the rotated segments of ``<state-dir>/audit/`` (and of the archive folder the
hospital moved old segments to) in seq order, then ``audit.jsonl``, recomputing each
record's hash (:func:`app.site_runtime.audit_format.record_hash`) and its link to the
previous one, and checks every anchor of the log (:mod:`app.site_runtime.audit_anchor`)
against the record of its seq. The anchors are read from where the policy's ``[audit]
anchor`` sends them (``--policy``), or from ``--anchor`` (``syslog``, an anchor file, or
``none``): an anchor file is read as it is; syslog anchors are read from ``journalctl -t
fedmed-audit -o cat``, or from ``--journal``, a file exported from the system log (where
``journalctl`` is not on this machine). The log's files are taken under its lock
(:meth:`~app.site_runtime.audit_log.AuditLog.snapshot`): a log the site is writing
verifies. It prints one line and exits 0 when the chain is intact, saying either
``intact and matches anchor seq N`` (with where the anchors came from) or ``chain intact
but NOT ANCHORED`` and why (no anchor named, none in the source yet); it exits 1 naming
the first problem, ``file:line``, seq and what happened; 2 for a missing folder, an
unreadable policy or anchor source.

What each problem means:

- ``edited``: a record's hash does not match its content; or the editor recomputed that
  hash, which breaks the next record's link (the edited record is the one named), or
  no longer matches ``head.json``, an anchor or the expected head. An anchor that does
  not match means the log was rewritten (every hash recomputed) at or before that record;
- ``removed``: a seq is missing (a deleted line, a deleted segment, the first records);
- ``reordered``: a seq comes before a smaller one;
- ``truncated``: ``head.json`` or an anchor names a later record than the last one, or the
  last line is torn (no newline);
- ``unreadable``: a line is not a JSON object with ``seq``, ``prev`` and ``hash``, or a
  segment cannot be read.

The chain alone proves the log was not edited *in place*. Someone able to write the
folder could still rewrite the whole chain from an early record on (recomputing every
hash and ``head.json``): the anchors, kept off the machine, catch that from the first
anchor after the rewritten record (a head archived by hand, ``--expect-head SEQ:HEX``,
does too).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.site_runtime.audit_anchor import Anchor, AnchorSource, read_anchors
from app.site_runtime.audit_format import (
    CURRENT_NAME, GENESIS, HEAD_NAME, audit_dir, record_hash, segment_paths,
)
from app.site_runtime.audit_log import AuditLog, AuditLogError, LogSnapshot
from clients.site.policy import SYSLOG_ANCHOR, load_policy
from strategies.wire.errors import FedMedError

__all__ = ["ChainBroken", "ChainReport", "ChainWalk", "read_head", "segment_lines",
           "verify_chain", "main"]

HEX64 = re.compile(r"[0-9a-f]{64}")
#: What ``--anchor`` takes to verify the chain alone.
NO_ANCHOR = "none"
#: Why a report has no anchor when no anchor source was given.
NOT_NAMED = "no anchor source named"


@dataclass(frozen=True)
class ChainReport:
    """The outcome of :func:`verify_chain`.

    Attributes
    ----------
    ok
        True when every record, link, seq and anchor checks out.
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
    anchor
        The anchor of the highest seq that matched (None: not anchored).
    anchors
        How many anchors matched.
    anchoring
        Where the anchors were read from, or why there are none (in words).
    note
        How the log was verified, when not in one pass (the console's incremental check).
    """

    ok: bool
    records: int
    head_hash: str
    problem: str | None = None
    seq: int | None = None
    file: str | None = None
    line: int | None = None
    detail: str = ""
    anchor: Anchor | None = None
    anchors: int = 0
    anchoring: str = NOT_NAMED
    note: str = ""

    def message(self) -> str:
        """One line: the OK summary and its anchors, or the first bad record's place, seq
        and problem."""
        if self.ok:
            summary = f"audit log OK: {self.records} records, head {self.head_hash}"
            if self.anchor is None:
                return f"{summary}; chain intact but NOT ANCHORED: {self.anchoring}"
            plural = "" if self.anchors == 1 else "s"
            return (f"{summary}; intact and matches anchor seq {self.anchor.seq} of "
                    f"{self.anchor.time} ({self.anchors} anchor{plural} checked, from "
                    f"{self.anchoring})")
        where = f"{self.file}:{self.line}" if self.line is not None else str(self.file)
        seq = f"seq {self.seq}" if self.seq is not None else "no seq"
        return f"audit log BROKEN at {where} ({seq}): {self.problem}: {self.detail}"


@dataclass(frozen=True)
class SegmentLine:
    """One line of a segment: its file, 1-based number, bytes, and whether it is torn."""

    file: Path
    number: int
    raw: bytes
    torn: bool


class ChainBroken(AuditLogError):
    """The first problem found: raised out of the walk, turned into a :class:`ChainReport`
    (:meth:`ChainWalk.report`)."""

    def __init__(self, problem: str, seq: int | None, place: SegmentLine | None, detail: str,
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


def segment_lines(path: Path, data: bytes | None, seq: int, first: int = 1
                  ) -> list[SegmentLine]:
    """The lines of one segment (``data``, else read from ``path``), numbered from ``first``
    (``data`` may be the part of a segment after its ``first - 1`` lines); the next seq
    due is ``seq`` (named when the file cannot be read, e.g. moved away while verified)."""
    if data is None:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ChainBroken("unreadable", seq, None, f"cannot read the segment: {exc}",
                              file=path) from exc
    parts = data.split(b"\n")
    lines = [SegmentLine(path, number, raw, False)
             for number, raw in enumerate(parts[:-1], start=first)]
    if parts[-1]:
        lines.append(SegmentLine(path, first + len(parts) - 1, parts[-1], True))
    return lines


def _parse(line: SegmentLine, loads: Callable[[bytes], Any]) -> dict[str, Any]:
    if line.torn:
        raise ChainBroken("truncated", None, line, "the last line is torn (no newline)")
    try:
        record = loads(line.raw)
    except ValueError as exc:
        raise ChainBroken("unreadable", None, line, f"not JSON: {exc}") from exc
    if not (isinstance(record, dict) and type(record.get("seq")) is int
            and isinstance(record.get("prev"), str) and isinstance(record.get("hash"), str)):
        raise ChainBroken("unreadable", None, line, "not a record with seq, prev and hash")
    return record


def read_head(raw: bytes | None, path: Path) -> dict[str, Any] | None:
    """``head.json``'s ``{"seq", "hash"}`` from its bytes (None: no head yet)."""
    if raw is None:
        return None
    try:
        head = json.loads(raw)
    except ValueError as exc:
        raise ChainBroken("unreadable", None, None, f"head.json: {exc}", file=path) from exc
    if not (isinstance(head, dict) and type(head.get("seq")) is int
            and isinstance(head.get("hash"), str)):
        raise ChainBroken("unreadable", None, None, "head.json is not {seq, hash}", file=path)
    return head


def _expected(expect_head: str | None) -> tuple[int | None, str] | None:
    if expect_head is None:
        return None
    seq, _, digest = expect_head.rpartition(":")
    if (seq and not seq.isdigit()) or not HEX64.fullmatch(digest.lower()):
        raise AuditLogError(f"--expect-head {expect_head!r}: not HEX or SEQ:HEX "
                            "(a SHA-256 in 64 hex digits)")
    return (int(seq) if seq else None), digest.lower()


class ChainWalk:
    """The chain walked record by record: the seq and hash each next record must link to.

    Parameters
    ----------
    head
        ``head.json`` (:func:`read_head`), checked when the walk reaches its seq.
    expect
        ``(seq or None, hash)`` of a head archived by hand (``--expect-head``).
    anchors
        The log's anchors (:func:`~app.site_runtime.audit_anchor.read_anchors`).
    loads
        What parses a line's JSON (the console's keeps repeated strings once).
    """

    def __init__(self, head: dict[str, Any] | None = None,
                 expect: tuple[int | None, str] | None = None,
                 anchors: AnchorSource | None = None,
                 loads: Callable[[bytes], Any] = json.loads) -> None:
        self.loads = loads
        self.seq, self.hash, self.count = 0, GENESIS, 0
        self.previous: tuple[SegmentLine, dict[str, Any]] | None = None
        self.head, self.expect, self.expect_seen = head, expect, False
        self.source = anchors
        self.anchors: dict[int, list[Anchor]] = {}
        for anchor in anchors.anchors if anchors is not None else ():
            self.anchors.setdefault(anchor.seq, []).append(anchor)
        self.matched: list[Anchor] = []

    def segment(self, lines: list[SegmentLine]) -> list[dict[str, Any]]:
        """Walk one segment's lines (a line that does not parse fails where it stands);
        return their records."""
        parsed: list[tuple[SegmentLine, dict[str, Any] | ChainBroken]] = []
        for line in lines:
            try:
                parsed.append((line, _parse(line, self.loads)))
            except ChainBroken as broken:
                parsed.append((line, broken))
        for index, (line, record) in enumerate(parsed):
            if isinstance(record, ChainBroken):
                record.seq = self.seq
                raise record
            self.record(line, record, parsed[index + 1:])
        return [record for _, record in parsed if isinstance(record, dict)]

    def record(self, line: SegmentLine, record: dict[str, Any],
               later: Sequence[tuple[SegmentLine, dict[str, Any] | ChainBroken]] = ()) -> None:
        """Check one record against its own hash, the chain so far and the anchors;
        ``later``: the segment's lines after it (a missing seq found there was moved)."""
        seq = record["seq"]
        if record_hash(record) != record["hash"]:
            raise ChainBroken("edited", seq, line, "the record's hash does not match its content")
        if seq != self.seq:
            if record["prev"] == self.hash:
                raise ChainBroken("edited", seq, line, f"seq {seq} where seq {self.seq} "
                                  "belongs (its seq was changed and its hash recomputed)")
            if seq < self.seq:
                raise ChainBroken("reordered", seq, line,
                                  f"seq {seq} comes after seq {self.seq - 1}")
            if any(isinstance(item, dict) and item["seq"] == self.seq for _, item in later):
                raise ChainBroken("reordered", seq, line,
                                  f"seq {seq} comes before seq {self.seq}")
            missing = f"seq {self.seq}" if seq == self.seq + 1 else f"seqs {self.seq}..{seq - 1}"
            raise ChainBroken("removed", self.seq, line, f"{missing} missing before seq {seq}")
        if record["prev"] != self.hash:
            if self.previous is None:
                raise ChainBroken("edited", seq, line,
                                  "the first record's prev is not the genesis")
            place, earlier = self.previous
            broken = ChainBroken("edited", earlier["seq"], place,
                                 f"its hash was recomputed: seq {seq}'s link no longer matches it")
            broken.good = (self.count - 1, earlier["prev"])
            raise broken
        for digest, what in self._recorded(seq):
            if record["hash"] != digest:
                raise ChainBroken("edited", seq, line, f"its hash is not {what}")
        self.matched += self.anchors.get(seq, [])
        if self.expect is not None and self.expect == (None, record["hash"]):
            self.expect_seen = True
        self.seq, self.hash, self.count = seq + 1, record["hash"], self.count + 1
        self.previous = (line, record)

    def _recorded(self, seq: int) -> Iterator[tuple[str, str]]:
        """The hashes recorded elsewhere for ``seq`` and by whom: head.json's, the anchors',
        the expected head's."""
        if self.head is not None and self.head["seq"] == seq:
            yield self.head["hash"], "the one head.json recorded"
        for anchor in self.anchors.get(seq, []):
            yield anchor.hash, (f"the one {anchor.where()} recorded in {self.source.source}: "
                                "the log was rewritten at or before this record")
        if self.expect is not None and self.expect[0] == seq:
            self.expect_seen = True
            yield self.expect[1], "the one --expect-head names"

    def end(self, last_file: Path) -> None:
        """Check the chain reaches head.json's record, every anchor and the expected head."""
        place = self.previous[0] if self.previous is not None else None
        line = place.number + 1 if place is not None else 1
        tail = SegmentLine(place.file if place else last_file, line, b"", False)
        if self.head is not None and self.head["seq"] >= self.seq:
            raise ChainBroken("truncated", self.seq, tail,
                              f"head.json names seq {self.head['seq']}, the log ends at "
                              f"seq {self.seq - 1}")
        beyond = sorted(seq for seq in self.anchors if seq >= self.seq)
        if beyond:
            anchor = self.anchors[beyond[0]][0]
            raise ChainBroken("truncated", self.seq, tail,
                              f"{anchor.where()} in {self.source.source} names seq "
                              f"{anchor.seq}, the log ends at seq {self.seq - 1}")
        if self.expect is not None and not self.expect_seen:
            expect_seq, digest = self.expect
            if expect_seq is not None and expect_seq >= self.seq:
                raise ChainBroken("truncated", self.seq, tail,
                                  f"the expected head is seq {expect_seq}, the log ends at "
                                  f"seq {self.seq - 1}")
            raise ChainBroken("edited", expect_seq, None,
                              f"no record has the expected head {digest}: the chain was "
                              "rewritten", file=last_file)

    def report(self, broken: ChainBroken | None = None, note: str = "") -> ChainReport:
        """The report of the walk so far: OK, or the first problem ``broken``."""
        anchoring = self._anchoring()
        if broken is None:
            newest = max(self.matched, key=lambda anchor: anchor.seq, default=None)
            return ChainReport(True, self.count, self.hash, anchor=newest,
                               anchors=len(self.matched), anchoring=anchoring, note=note)
        records, head_hash = broken.good or (self.count, self.hash)
        return ChainReport(False, records, head_hash, broken.problem, broken.seq,
                           str(broken.file), broken.place.number if broken.place else None,
                           broken.detail, anchoring=anchoring, note=note)

    def _anchoring(self) -> str:
        if self.source is None:
            return NOT_NAMED
        if self.anchors:
            return self.source.source
        others = f" ({self.source.others} of other logs)" if self.source.others else ""
        return f"{self.source.source} holds no anchor of this log yet{others}"


def verify_chain(state_dir: str | Path, archive: str | Path | None = None,
                 expect_head: str | None = None,
                 anchors: AnchorSource | None = None) -> ChainReport:
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
        it (at that seq).
    anchors
        The log's anchors (:func:`~app.site_runtime.audit_anchor.read_anchors`): each must
        match the record of its seq, the defence against a rewrite of the whole chain,
        which leaves every hash, link and ``head.json`` consistent.

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
    walk = ChainWalk(None, _expected(expect_head), anchors)
    snapshot = AuditLog(state).snapshot()
    try:
        walk.head = read_head(snapshot.head, folder / HEAD_NAME)
        segments = _segments(snapshot, folder, Path(archive) if archive is not None else None)
        for path, data in segments:
            walk.segment(segment_lines(path, data, walk.seq))
        walk.end(segments[-1][0] if segments else folder / CURRENT_NAME)
    except ChainBroken as broken:
        return walk.report(broken)
    return walk.report()


def _anchors_of(args: argparse.Namespace, folder: Path) -> AnchorSource | str:
    """The anchors the command line names (``--anchor``, else ``--policy``'s), or why none."""
    if args.anchor is not None:
        anchor, named = args.anchor, "--anchor"
    elif args.policy is not None:
        anchor, named = load_policy(args.policy).audit.anchor, f"the policy {args.policy}"
    else:
        return "no --policy or --anchor named the anchors"
    if anchor in ("", NO_ANCHOR):
        return f"{named} names no anchor"
    if anchor != SYSLOG_ANCHOR and not Path(anchor).is_absolute():
        raise AuditLogError(f"--anchor {anchor!r}: not \"{SYSLOG_ANCHOR}\", \"{NO_ANCHOR}\" "
                            "or an absolute path")
    return read_anchors(anchor, folder, args.journal)


def main(argv: Sequence[str] | None = None) -> int:
    """Verify and print one line; 0 when intact, 1 when broken, 2 for a missing folder or an
    unreadable policy or anchor source."""
    parser = argparse.ArgumentParser(prog="python -m app.site_runtime.audit_chain",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--state", required=True, help="the site's state dir")
    parser.add_argument("--policy", help="the site policy: its [audit] anchor names the anchors")
    parser.add_argument("--anchor", help="where the anchors are, instead of the policy's: "
                        f"syslog, /abs/anchor-file, or {NO_ANCHOR}")
    parser.add_argument("--journal", help="syslog anchors exported to a file (journalctl -t "
                        "fedmed-audit -o cat), read instead of journalctl")
    parser.add_argument("--archive", help="a folder holding rotated segments moved away")
    parser.add_argument("--expect-head", help="a head archived earlier: HEX or SEQ:HEX")
    args = parser.parse_args(argv)
    try:
        state = Path(args.state)
        anchors = _anchors_of(args, audit_dir(state)) if state.is_dir() else None
        report = verify_chain(state, args.archive, args.expect_head,
                              anchors if isinstance(anchors, AnchorSource) else None)
    except FedMedError as exc:
        print(exc, file=sys.stderr)
        return 2
    if isinstance(anchors, str):
        report = replace(report, anchoring=anchors)
    print(report.message())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
