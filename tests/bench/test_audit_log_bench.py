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
                         "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["name"] for r in result["runs"]] == [
        "fsync", "no-fsync", "fsync-rotating", "no-fsync-rotating"]
    assert [r["fsync"] for r in result["runs"]] == [True, False, True, False]
    assert all(r["records"] == 40 for r in result["runs"])
    assert result["runs"][2]["segments"] > result["runs"][0]["segments"] == 1
    assert result["machine"]["cpus"] >= 1
