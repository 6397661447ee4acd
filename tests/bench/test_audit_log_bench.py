"""The audit-log benchmark appends real records to a real log, verifies it, reports its runs."""

from __future__ import annotations

import importlib
import json

from app.site_runtime.audit_log import AuditLog


def _load():
    return importlib.import_module("audit_log")


def test_a_run_appends_verifies_and_measures_the_log(tmp_path):
    (row,) = _load().measure([("rotating", False, 4096)], 60, tmp_path)
    records = list(AuditLog(tmp_path / "rotating").records())
    assert len(records) == 60 and row["segments"] > 3
    assert sum(r["decision"] == "refused" for r in records) == 6
    folder = tmp_path / "rotating" / "audit"
    on_disk = sum(p.stat().st_size for p in folder.iterdir() if p.name != ".lock")
    assert row["bytes_per_1000"] == on_disk * 1000 / 60
    assert 0 < row["us_per_record_median"] <= row["us_per_record_p95"]
    assert row["verify_seconds_per_1000"] > 0


def test_the_command_writes_every_run(tmp_path):
    out = tmp_path / "audit_log.json"
    assert _load().main(["--records", "40", "--rotate-bytes", "4096", "--dir", str(tmp_path),
                         "--console-sizes", "20,50", "--pages", "1", "--new", "2",
                         "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["name"] for r in result["runs"]] == [
        "fsync", "no-fsync", "fsync-rotating", "no-fsync-rotating"]
    assert [r["fsync"] for r in result["runs"]] == [True, False, True, False]
    assert all(r["records"] == 40 for r in result["runs"])
    assert result["runs"][2]["segments"] > result["runs"][0]["segments"] == 1
    assert [r["records"] for r in result["console"]] == [20, 50]
    assert result["machine"]["cpus"] >= 1


def test_a_console_page_reads_only_the_records_appended_since_the_last(tmp_path):
    rows = _load().console_pages([30, 300], tmp_path, pages=2, new=4)
    assert [r["records"] for r in rows] == [30, 300]
    for row in rows:
        assert row["records_parsed_per_page"] == [4]
        assert 0 < row["page_s_median"] <= row["page_s_max"]
        assert row["page_peak_mb_median"] > 0 and row["view_holds_mb"] > 0
        assert row["first_page_s"] > 0 and row["full_page_peak_mb"] > 0
    assert rows[1]["view_holds_mb"] > rows[0]["view_holds_mb"]
    log = AuditLog(tmp_path / "console-300")
    assert len(list(log.records())) == 300 + 2 * 2 * 4  # each page: one timed, one traced
