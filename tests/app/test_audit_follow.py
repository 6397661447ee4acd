"""The audit log verified as it grows (app/site_runtime/audit_follow.py), as the console's
AuditView reads it: a page after N new records reads those N alone, whatever the log's length;
a change to what was verified is verified in full again and said (#44)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from app.site_runtime.audit_chain import verify_chain
from app.site_runtime.audit_follow import AuditFollower
from app.site_runtime.audit_format import canonical_json, record_hash
from app.site_runtime.audit_log import AuditLog, audit_dir
from app.site_runtime.console_pages import (
    AuditRecords, AuditView, activity_rows, chain_banner, overview,
)


def _append(log: AuditLog, count: int, start: int = 0) -> None:
    for number in range(start, start + count):
        log.append({"kind": "message", "run": 7 + number % 2, "type": "train",
                    "decision": "refused" if number % 3 == 0 else "answered",
                    "bytes_sent": 100 * number, "asked": {"batch-size": 8}})


def _current(state: Path) -> Path:
    return audit_dir(state) / "audit.jsonl"


@pytest.mark.parametrize("max_bytes", [2**20, 700])  # one segment; rotations in between
def test_a_page_after_n_new_records_reads_those_n_alone(tmp_path, max_bytes):
    log = AuditLog(tmp_path, max_bytes=max_bytes, sync=False)
    _append(log, 40)
    view = AuditView(tmp_path)
    records, _, chain = view.snapshot()
    assert view.parsed == 40 and chain.ok and chain.records == 40 and len(records) == 40
    for new in (1, 7, 0, 12):
        before = view.parsed
        _append(log, new, start=len(records))
        records, error, chain = view.snapshot()
        assert view.parsed - before == new
        assert chain.ok and chain.note == "" and error == ""
        assert chain.records == len(records) == verify_chain(tmp_path).records
        assert [r["seq"] for r in records] == list(range(len(records)))
    assert list(records) == list(log.records())
    if max_bytes < 2**20:
        assert len(list(audit_dir(tmp_path).glob("audit-*.jsonl"))) > 3


def test_an_edit_of_a_verified_line_is_verified_in_full_and_named(tmp_path):
    log = AuditLog(tmp_path, sync=False)
    _append(log, 10)
    view = AuditView(tmp_path)
    view.snapshot()
    original = _current(tmp_path).read_bytes()
    lines = original.splitlines(keepends=True)
    edited = json.loads(lines[3])
    edited["decision"] = "answered-ok"  # the file grows: the last verified line moved
    _current(tmp_path).write_bytes(b"".join(lines[:3] + [canonical_json(edited) + b"\n"]
                                            + lines[4:]))
    records, _, chain = view.snapshot()
    assert (chain.ok, chain.problem, chain.seq) == (False, "edited", 3)
    assert len(records) == 10  # what the log holds, listed all the same
    assert not chain_banner(chain)["ok"]
    _current(tmp_path).write_bytes(original)
    records, _, chain = view.snapshot()
    assert chain.ok and chain.records == 10


def test_a_replaced_segment_is_verified_in_full_again_and_said(tmp_path, caplog):
    log = AuditLog(tmp_path, sync=False)
    _append(log, 10)
    view = AuditView(tmp_path)
    view.snapshot()
    copy = tmp_path / "copy.jsonl"
    shutil.copy(_current(tmp_path), copy)
    os.replace(copy, _current(tmp_path))  # the same bytes in another file
    _append(log, 2, start=10)
    before = view.parsed
    records, _, chain = view.snapshot()
    assert chain.ok and len(records) == 12 and view.parsed - before == 12
    assert chain.note == "verified in full again: audit.jsonl is another file than the one " \
                         "verified"
    assert chain_banner(chain)["text"] == f"audit log verified, 12 records ({chain.note})"
    assert "verified in full again" in caplog.text
    before = view.parsed
    _append(log, 3, start=12)
    records, _, chain = view.snapshot()
    assert view.parsed - before == 3 and chain.ok and chain.note == ""


def test_a_cut_or_torn_tail_after_a_page_is_named(tmp_path):
    log = AuditLog(tmp_path, sync=False)
    _append(log, 10)
    view = AuditView(tmp_path)
    view.snapshot()
    with open(_current(tmp_path), "ab") as handle:
        handle.write(b'{"kind":"message","seq":10')
    _, _, chain = view.snapshot()
    assert (chain.ok, chain.problem, chain.seq, chain.line) == (False, "truncated", 10, 11)
    follower = AuditFollower(tmp_path)
    assert follower.refresh().report.problem == "truncated"


def test_a_rolled_back_head_is_verified_in_full(tmp_path):
    log = AuditLog(tmp_path, sync=False)
    _append(log, 10)
    follower = AuditFollower(tmp_path)
    assert follower.refresh().report.ok
    lines = _current(tmp_path).read_bytes().splitlines()
    (audit_dir(tmp_path) / "head.json").write_bytes(canonical_json(
        {"seq": 5, "hash": json.loads(lines[5])["hash"]}))
    result = follower.refresh()
    assert result.full and result.reason == "head.json names seq 5, before seq 9"
    assert result.report.ok  # the chain holds seq 5's hash: the log itself is intact
    forged = json.loads(lines[5])
    forged["hash"] = record_hash({**forged, "bytes_sent": 1})
    (audit_dir(tmp_path) / "head.json").write_bytes(canonical_json(
        {"seq": 5, "hash": forged["hash"]}))
    report = follower.refresh().report
    assert (report.problem, report.seq) == ("edited", 5)


def test_segments_moved_to_the_archive_are_followed(tmp_path):
    state, archive = tmp_path / "state", tmp_path / "archive"
    archive.mkdir()
    log = AuditLog(state, max_bytes=700, sync=False)
    _append(log, 30)
    view = AuditView(state, archive)
    view.snapshot()
    rotated = sorted(audit_dir(state).glob("audit-*.jsonl"))
    for segment in rotated[:2]:  # moved on the same file system: the same files
        os.replace(segment, archive / segment.name)
    before = view.parsed
    _append(log, 2, start=30)
    _, _, chain = view.snapshot()
    assert chain.ok and chain.records == 32 and view.parsed - before == 2
    shutil.copy(rotated[2], archive / rotated[2].name)  # copied: another file
    rotated[2].unlink()
    _append(log, 1, start=32)
    _, _, chain = view.snapshot()
    assert chain.ok and chain.records == 33
    assert chain.note == f"verified in full again: {rotated[2].name} is another file than " \
                         "the one verified"


def test_the_pages_counts_and_rows_come_from_the_index(tmp_path):
    log = AuditLog(tmp_path, sync=False)
    _append(log, 30)
    log.append({"kind": "policy-change", "fingerprint": "f" * 16, "by": "console"})
    plain = list(log.records())
    indexed = AuditRecords(plain[:10])
    indexed.extend(plain[10:])
    today = plain[0]["time"][:10]
    assert overview(indexed, today) == overview(plain, today)
    assert overview(indexed, today)["counts"] == {"answered": 20, "refused": 10, "failed": 0}
    assert overview(indexed, today)["last"] == plain[29]
    for wanted in ({}, {"decision": "refused"}, {"run": "8", "decision": "refused"},
                   {"kind": "policy-change"}, {"type": "query"}):
        rows = activity_rows(indexed, **{"type_" if k == "type" else k: v
                                         for k, v in wanted.items()})
        expected = [r for r in reversed(plain)
                    if all(str(r.get(k, "")) == v for k, v in wanted.items())]
        assert len(rows) == len(expected)
        assert [r["seq"] for r in rows[:5]] == [r["seq"] for r in expected[:5]]
        assert [r["seq"] for r in rows] == [r["seq"] for r in expected]
        if expected:
            assert rows[-1]["seq"] == expected[-1]["seq"] and "detail" in rows[0]
    with pytest.raises(IndexError):
        activity_rows(indexed, kind="none-such")[0]
