"""The site's audit log (app/site_runtime/audit_log.py): one chained JSON line per record,
written by several processes, rotated by size without breaking the chain."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import threading
from pathlib import Path

import pytest

from app.site_runtime.audit_chain import verify_chain
from app.site_runtime.audit_format import canonical_json, segment_name
from app.site_runtime.audit_log import GENESIS, AuditLog, AuditLogError, audit_dir


def _message(number: int) -> dict:
    return {"kind": "message", "site": "hospital-a", "run": 7, "federation": "fed-1",
            "app": "ab" * 32, "type": "train", "decision": "answered", "rule": None,
            "error_code": None, "bytes_sent": 1000 + number, "epsilon": 0.0, "seconds": 0.5,
            "asked": {"local-steps": 10, "batch-size": 8, "codec": "topk:0.1",
                      "server-round": number}}


def _lines(state: Path) -> list[dict]:
    return [json.loads(line) for line in
            (audit_dir(state) / "audit.jsonl").read_text(encoding="utf-8").splitlines()]


def test_records_come_back_as_written_with_seq_time_and_links(tmp_path):
    log = AuditLog(tmp_path)
    written = [log.append(_message(n)) for n in range(3)]
    assert list(log.records()) == written
    assert [r["seq"] for r in written] == [0, 1, 2]
    assert written[0]["prev"] == GENESIS
    assert [r["prev"] for r in written[1:]] == [r["hash"] for r in written[:-1]]
    for record in written:
        body = {k: v for k, v in record.items() if k != "hash"}
        assert record["hash"] == hashlib.sha256(canonical_json(body)).hexdigest()
        assert record["time"].endswith("Z") and record["asked"]["batch-size"] == 8
    assert log.head() == {"seq": 2, "hash": written[-1]["hash"]}
    raw = (audit_dir(tmp_path) / "audit.jsonl").read_bytes().splitlines()
    assert raw[0] == json.dumps(written[0], sort_keys=True, separators=(",", ":")).encode()


def test_a_given_time_is_kept_and_a_new_log_has_no_head(tmp_path):
    log = AuditLog(tmp_path)
    assert log.head() is None and list(log.records()) == []
    record = log.append({"kind": "node-start", "site": "a", "policy": "f" * 16,
                         "time": "2026-01-02T03:04:05Z"})
    assert record["time"] == "2026-01-02T03:04:05Z"


@pytest.mark.parametrize("record, key", [
    ({"kind": "message", "seq": 4}, "seq"),
    ({"kind": "message", "prev": GENESIS}, "prev"),
    ({"kind": "message", "hash": "0"}, "hash"),
    ({"site": "a"}, "kind"),
    ({"kind": "message", "asked": {"steps": [1, 2]}}, "asked.steps"),
    ({"kind": "message", "asked": {"deep": {"x": 1}}}, "asked.deep"),
    ({"kind": "message", "epsilon": float("nan")}, "epsilon"),
    ({"kind": "message", "image": b"\x00"}, "image"),
    ({"kind": "message", "path": Path("/x")}, "path"),
])
def test_records_with_chain_keys_or_non_json_values_are_refused_naming_the_key(
        tmp_path, record, key):
    log = AuditLog(tmp_path)
    with pytest.raises(AuditLogError, match=f"'{key}'"):
        log.append(record)
    assert log.head() is None


def _append_many(state: str, worker: int, count: int) -> None:
    log = AuditLog(state, max_bytes=4096)
    for number in range(count):
        log.append({"kind": "message", "site": f"worker-{worker}", "asked": {"n": number}})


def test_two_processes_appending_give_one_unbroken_chain(tmp_path):
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_append_many, args=(str(tmp_path), w, 200))
               for w in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    records = list(AuditLog(tmp_path).records())
    assert [r["seq"] for r in records] == list(range(400))
    for worker in range(2):
        numbers = [r["asked"]["n"] for r in records if r["site"] == f"worker-{worker}"]
        assert numbers == list(range(200))
    report = verify_chain(tmp_path)
    assert report.ok and report.records == 400 and report.head_hash == records[-1]["hash"]
    assert len(list(audit_dir(tmp_path).glob("audit-*.jsonl"))) > 1


def test_threads_sharing_one_log_give_one_unbroken_chain(tmp_path):
    log = AuditLog(tmp_path, max_bytes=2048, sync=False)
    threads = [threading.Thread(target=lambda w=w: [log.append(
        {"kind": "message", "site": f"thread-{w}", "asked": {"n": n}}) for n in range(50)])
        for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [r["seq"] for r in log.records()] == list(range(200))
    assert verify_chain(tmp_path).ok


def test_rotation_by_size_keeps_the_chain_across_segments(tmp_path):
    log = AuditLog(tmp_path, max_bytes=1500)
    written = [log.append(_message(n)) for n in range(20)]
    folder = audit_dir(tmp_path)
    rotated = sorted(folder.glob("audit-*.jsonl"))
    assert len(rotated) >= 3
    firsts = [json.loads(path.read_text().splitlines()[0])["seq"] for path in rotated]
    assert [path.name for path in rotated] == [segment_name(seq) for seq in firsts]
    assert firsts[0] == 0
    for path in rotated:  # rotated before an append once it held max_bytes or more
        size = path.stat().st_size
        last = len(path.read_bytes().splitlines()[-1]) + 1
        assert size - last < 1500 <= size
    assert list(log.records()) == written
    current = _lines(tmp_path)
    assert current[0]["prev"] == json.loads(rotated[-1].read_text().splitlines()[-1])["hash"]
    report = verify_chain(tmp_path)
    assert report.ok and report.records == 20


def test_a_missing_head_is_rebuilt_from_the_last_line(tmp_path, caplog):
    log = AuditLog(tmp_path)
    first = [log.append(_message(n)) for n in range(3)]
    (audit_dir(tmp_path) / "head.json").unlink()
    with caplog.at_level("WARNING", logger="app.site_runtime.audit_log"):
        record = AuditLog(tmp_path).append(_message(3))
    assert record["seq"] == 3 and record["prev"] == first[-1]["hash"]
    assert "head.json missing: continuing from the last line of" in caplog.text
    assert verify_chain(tmp_path).ok


def test_a_head_left_behind_by_a_cut_write_does_not_fork_the_chain(tmp_path):
    log = AuditLog(tmp_path)
    log.append(_message(0))
    stale = (audit_dir(tmp_path) / "head.json").read_bytes()
    second = log.append(_message(1))
    (audit_dir(tmp_path) / "head.json").write_bytes(stale)  # the line was written, not the head
    third = log.append(_message(2))
    assert third["seq"] == 2 and third["prev"] == second["hash"]
    assert verify_chain(tmp_path).ok


def test_a_torn_last_line_stays_a_line_of_its_own(tmp_path):
    log = AuditLog(tmp_path)
    log.append(_message(0))
    with open(audit_dir(tmp_path) / "audit.jsonl", "ab") as handle:
        handle.write(b'{"kind":"mess')
    record = log.append(_message(1))
    raw = (audit_dir(tmp_path) / "audit.jsonl").read_bytes().splitlines()
    assert raw[1] == b'{"kind":"mess' and json.loads(raw[2])["seq"] == record["seq"] == 1
    report = verify_chain(tmp_path)
    assert (report.problem, report.line) == ("unreadable", 2)


def test_an_unreadable_last_line_is_passed_over_while_head_json_holds_the_chain(tmp_path):
    log = AuditLog(tmp_path)
    first = log.append(_message(0))
    with open(audit_dir(tmp_path) / "audit.jsonl", "ab") as handle:
        handle.write(b"garbage\n")
    record = log.append(_message(1))
    assert (record["seq"], record["prev"]) == (1, first["hash"])
    (audit_dir(tmp_path) / "head.json").unlink()
    with open(audit_dir(tmp_path) / "audit.jsonl", "ab") as handle:
        handle.write(b"garbage\n")
    with pytest.raises(AuditLogError, match="audit.jsonl: last line unreadable"):
        log.append(_message(2))


def test_records_name_the_file_and_line_of_a_line_that_is_not_json(tmp_path):
    log = AuditLog(tmp_path)
    log.append(_message(0))
    with open(audit_dir(tmp_path) / "audit.jsonl", "ab") as handle:
        handle.write(b"[1, 2]\n")
    with pytest.raises(AuditLogError, match=r"audit.jsonl:2: not a JSON object"):
        list(log.records())


@pytest.mark.parametrize("sync", [True, False])
def test_each_record_is_one_write_and_is_fsynced_with_the_head(tmp_path, monkeypatch, sync):
    log = AuditLog(tmp_path, sync=sync)
    log.append(_message(0))
    writes, syncs = [], []
    real_write, real_fsync = os.write, os.fsync

    def write(fd, data):
        writes.append(bytes(data))
        return real_write(fd, data)

    def fsync(fd):
        syncs.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "fsync", fsync)
    record = log.append(_message(1))
    assert writes[0] == canonical_json(record) + b"\n" and len(writes) == 2
    assert json.loads(writes[1]) == {"seq": 1, "hash": record["hash"]}
    if sync:
        assert syncs[0] == str(audit_dir(tmp_path) / "audit.jsonl")
        assert Path(syncs[1]).name.startswith("head.json") and len(syncs) == 2
    else:
        assert syncs == []
