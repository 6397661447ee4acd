"""Verification of the site's audit log (app/site_runtime/audit_chain.py): an edited, removed,
reordered or cut record is named by file, line and seq; `make audit-verify`'s exit codes."""

from __future__ import annotations

import json
import multiprocessing
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.site_runtime.audit_chain import main, verify_chain
from app.site_runtime.audit_format import canonical_json, record_hash
from app.site_runtime.audit_log import AuditLog, AuditLogError, audit_dir

ROOT = Path(__file__).resolve().parents[2]


def _write(state: Path, count: int, max_bytes: int = 2**20) -> list[dict]:
    log = AuditLog(state, max_bytes=max_bytes, sync=False)
    return [log.append({"kind": "message", "type": "train", "decision": "answered",
                        "bytes_sent": 100 * n, "asked": {"batch-size": 8, "server-round": n}})
            for n in range(count)]


def _current(state: Path) -> Path:
    return audit_dir(state) / "audit.jsonl"


def _rewrite(path: Path, change) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(change(lines)))


def _edit(line: bytes, recompute: bool, **fields) -> bytes:
    record = json.loads(line)
    record.update(fields)
    if recompute:
        record["hash"] = record_hash(record)
    return canonical_json(record) + b"\n"


def _where(report) -> tuple:
    return report.problem, report.seq, Path(report.file).name, report.line


@pytest.fixture()
def state(tmp_path) -> Path:
    _write(tmp_path, 10)
    return tmp_path


def test_an_untouched_log_verifies(state):
    report = verify_chain(state)
    assert report.ok and report.records == 10 and report.problem is None
    assert report.head_hash == AuditLog(state).head()["hash"]
    assert report.message() == (f"audit log OK: 10 records, head {report.head_hash}; chain "
                                "intact but NOT ANCHORED: no anchor source named")


def test_a_state_dir_without_a_log_is_an_empty_ok_log(tmp_path):
    report = verify_chain(tmp_path)
    assert report.ok and report.records == 0


@pytest.mark.parametrize("recompute", [False, True])
def test_an_edited_middle_record_is_named(state, recompute):
    _rewrite(_current(state), lambda lines: lines[:4] + [
        _edit(lines[4], recompute, bytes_sent=0)] + lines[5:])
    report = verify_chain(state)
    assert not report.ok
    assert _where(report) == ("edited", 4, "audit.jsonl", 5)
    assert report.records == 4
    assert report.message().startswith(f"audit log BROKEN at {_current(state)}:5 (seq 4): edited")


def test_an_edited_last_record_with_its_hash_recomputed_is_caught_by_the_head(state):
    _rewrite(_current(state), lambda lines: lines[:9] + [_edit(lines[9], True, rule="x")])
    assert _where(verify_chain(state)) == ("edited", 9, "audit.jsonl", 10)


def test_a_deleted_middle_line_is_named_as_removed(state):
    _rewrite(_current(state), lambda lines: lines[:4] + lines[5:])
    report = verify_chain(state)
    assert _where(report) == ("removed", 4, "audit.jsonl", 5)
    assert "seq 4 missing before seq 5" in report.message()


def test_two_swapped_lines_are_named_as_reordered(state):
    _rewrite(_current(state), lambda lines: lines[:3] + [lines[4], lines[3]] + lines[5:])
    report = verify_chain(state)
    assert _where(report) == ("reordered", 4, "audit.jsonl", 4)
    assert "seq 4 comes before seq 3" in report.message()


def test_a_cut_tail_is_named_as_truncated(state):
    _rewrite(_current(state), lambda lines: lines[:-3])
    report = verify_chain(state)
    assert _where(report) == ("truncated", 7, "audit.jsonl", 8)
    assert "head.json names seq 9, the log ends at seq 6" in report.message()


def test_a_torn_last_line_is_named_as_truncated(state):
    _rewrite(_current(state), lambda lines: lines[:-1] + [lines[-1][:40]])
    assert _where(verify_chain(state)) == ("truncated", 9, "audit.jsonl", 10)


def test_a_line_that_is_not_json_is_unreadable_and_earlier_problems_come_first(state):
    _rewrite(_current(state), lambda lines: lines[:6] + [b"not json\n"] + lines[7:])
    assert _where(verify_chain(state)) == ("unreadable", 6, "audit.jsonl", 7)
    _rewrite(_current(state), lambda lines: lines[:2] + lines[3:])
    assert _where(verify_chain(state)) == ("removed", 2, "audit.jsonl", 3)


@pytest.mark.parametrize("recompute", [False, True])
def test_a_changed_seq_is_named_as_edited(state, recompute):
    _rewrite(_current(state), lambda lines: lines[:4] + [_edit(lines[4], recompute, seq=40)]
             + lines[5:])
    report = verify_chain(state)
    assert _where(report) == ("edited", 40, "audit.jsonl", 5)


def test_a_repeated_line_is_named_as_reordered(state):
    _rewrite(_current(state), lambda lines: lines[:5] + [lines[4]] + lines[5:])
    report = verify_chain(state)
    assert _where(report) == ("reordered", 4, "audit.jsonl", 6)
    assert "seq 4 comes after seq 4" in report.message()


def _segments(state: Path) -> list[Path]:
    return sorted(audit_dir(state).glob("audit-*.jsonl"))


@pytest.fixture()
def rotated(tmp_path) -> Path:
    _write(tmp_path, 30, max_bytes=1000)
    assert len(_segments(tmp_path)) >= 4
    return tmp_path


def test_problems_in_rotated_segments_name_that_segment(rotated):
    segment = _segments(rotated)[1]
    first = json.loads(segment.read_bytes().splitlines()[0])["seq"]
    _rewrite(segment, lambda lines: lines[:1] + [_edit(lines[1], False, type="query")]
             + lines[2:])
    assert _where(verify_chain(rotated)) == ("edited", first + 1, segment.name, 2)


def test_a_deleted_segment_is_named_as_removed(rotated):
    middle, after = _segments(rotated)[1:3]
    first = json.loads(middle.read_bytes().splitlines()[0])["seq"]
    middle.unlink()
    report = verify_chain(rotated)
    assert _where(report) == ("removed", first, after.name, 1)
    oldest = _segments(rotated)[0]
    oldest.unlink()
    assert _where(verify_chain(rotated))[:2] == ("removed", 0)


def test_the_tail_cut_from_a_rotated_segment_is_named_as_removed(rotated):
    segment, after = _segments(rotated)[:2]
    _rewrite(segment, lambda lines: lines[:-1])
    last = json.loads(after.read_bytes().splitlines()[0])["seq"] - 1
    assert _where(verify_chain(rotated)) == ("removed", last, after.name, 1)


def test_a_segment_that_cannot_be_read_is_named_as_unreadable(rotated):
    segment = _segments(rotated)[1]
    first = json.loads(segment.read_bytes().splitlines()[0])["seq"]
    segment.unlink()
    segment.mkdir()  # read as root too: a folder by the segment's name
    report = verify_chain(rotated)
    assert (report.problem, report.seq, report.file, report.line) == (
        "unreadable", first, str(segment), None)
    assert "cannot read the segment" in report.message()


def test_segments_moved_to_an_archive_folder_are_read_in_place(rotated, tmp_path_factory):
    archive = tmp_path_factory.mktemp("archive")
    for segment in _segments(rotated)[:2]:
        shutil.move(segment, archive / segment.name)
    assert _where(verify_chain(rotated))[:2] == ("removed", 0)
    report = verify_chain(rotated, archive=archive)
    assert report.ok and report.records == 30
    moved = sorted(archive.iterdir())[1]
    _rewrite(moved, lambda lines: lines[1:])
    assert verify_chain(rotated, archive=archive).problem == "removed"


def test_a_rewritten_chain_is_caught_only_by_an_archived_head(tmp_path):
    original, forged = tmp_path / "original", tmp_path / "forged"
    written = _write(original, 10)
    log = AuditLog(forged, sync=False)
    for record in written:  # the same records, one of them changed, every hash recomputed
        body = {k: v for k, v in record.items() if k not in ("seq", "prev", "hash")}
        log.append({**body, "decision": "refused"} if record["seq"] == 5 else body)
    assert verify_chain(forged).ok
    archived = written[7]["hash"]
    assert verify_chain(original, expect_head=archived).ok
    assert verify_chain(original, expect_head=f"7:{archived}").ok
    assert _where(verify_chain(forged, expect_head=f"7:{archived}")) == (
        "edited", 7, "audit.jsonl", 8)
    report = verify_chain(forged, expect_head=archived)
    assert (report.problem, report.seq) == ("edited", None)
    assert "no record has the expected head" in report.message()
    assert verify_chain(original, expect_head=f"12:{archived}").problem == "truncated"
    for malformed in (f"x:{archived}", "7:abc", archived + "0"):
        with pytest.raises(AuditLogError, match="expect-head"):
            verify_chain(original, expect_head=malformed)


def test_the_command_prints_one_line_and_exits_0_1_or_2(state, tmp_path, capsys):
    assert main(["--state", str(state)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("audit log OK: 10 records, head ") and out.count("\n") == 1
    _rewrite(_current(state), lambda lines: lines[:4] + lines[5:])
    assert main(["--state", str(state)]) == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and f"{_current(state)}:5 (seq 4): removed" in out
    missing = tmp_path / "nowhere"
    assert main(["--state", str(missing)]) == 2
    assert f"state dir {missing}: no such folder" in capsys.readouterr().err
    assert main(["--state", str(state), "--archive", str(missing)]) == 2
    assert f"archive {missing}: no such folder" in capsys.readouterr().err


def test_the_module_runs_as_a_command_with_its_exit_status(state):
    _rewrite(_current(state), lambda lines: lines[:-3])
    done = subprocess.run([sys.executable, "-m", "app.site_runtime.audit_chain", "--state",
                           str(state)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stdout == (f"audit log BROKEN at {_current(state)}:8 (seq 7): truncated: "
                           "head.json names seq 9, the log ends at seq 6\n")


def _append_rotating(state: str, count: int) -> None:
    log = AuditLog(state, max_bytes=2048, sync=False)
    for number in range(count):
        log.append({"kind": "message", "asked": {"n": number}})


def test_a_log_read_while_another_process_appends_and_rotates_always_verifies(tmp_path):
    writer = multiprocessing.get_context("spawn").Process(
        target=_append_rotating, args=(str(tmp_path), 300))
    writer.start()
    reports, seen = [], []
    while writer.is_alive() or not reports:
        reports.append(verify_chain(tmp_path))
        seen.append([record["seq"] for record in AuditLog(tmp_path).records()])
    writer.join(60)
    assert writer.exitcode == 0
    assert [report.message() for report in reports if not report.ok] == []
    assert all(seqs == list(range(len(seqs))) for seqs in seen)
    assert verify_chain(tmp_path).records == 300
