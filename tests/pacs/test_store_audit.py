"""A store of make predict's results is audited (issue 48, 3 and 5): a ``pacs-store`` record in
the site's audit log with the counts by kind, bytes and the destination's kind, no UID, name or
path; the chain still verifies; ``--store-to`` without ``--state`` is refused before anything."""

from __future__ import annotations

import io
from pathlib import Path

import pydicom
import pytest

from app.predict import main as predict_main, store_audited
from app.site_runtime.audit_chain import verify_chain
from app.site_runtime.audit_log import AuditLog, audit_dir
from app.tooling.environment import free_port
from clients.pacs.cohort import load_cohort
from tests.pacs.test_runtime_sync import identifiers
from tests.pacs.test_store import _results


def _store_records(state: Path) -> list[dict]:
    return [r for r in AuditLog(state).records() if r["kind"] == "pacs-store"]


@pytest.mark.parametrize("transport", ["dicomweb", "dimse"])
def test_a_store_appends_its_counts_to_the_audit_log_and_no_identifier(own_hospital, tmp_path,
                                                                       transport):
    out = tmp_path / "out"
    seg, sr = _results(own_hospital.site_dir, out)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    cohort = load_cohort(own_hospital.cohort_file(transport, name=f"audit-{transport}"))
    lines = io.StringIO()
    report = store_audited(cohort, out, state, lines)
    assert report.stored == 2 and lines.getvalue().startswith("stored 2 of 2 DICOM object(s)")
    (record,) = _store_records(state)
    assert {k: record[k] for k in ("by", "transport", "objects", "stored", "failed", "not-sent",
                                   "stored-SEG", "stored-SR", "not-stored-SEG",
                                   "not-stored-SR")} == {
        "by": "predict", "transport": transport, "objects": 2, "stored": 2, "failed": 0,
        "not-sent": 0, "stored-SEG": 1, "stored-SR": 1, "not-stored-SEG": 0, "not-stored-SR": 0}
    assert record["stored-bytes"] == seg.stat().st_size + sr.stat().st_size
    secret = identifiers(own_hospital.site_dir)
    for path in (seg, sr):
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        secret |= {ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.SOPInstanceUID}
    text = b"".join(f.read_bytes() for f in sorted(audit_dir(state).rglob("*")) if f.is_file())
    assert not [s for s in secret if s.encode() in text]
    assert str(tmp_path).encode() not in text and cohort.endpoint.encode() not in text
    strings = {k: v for k, v in record.items() if isinstance(v, str)}
    assert set(strings) <= {"kind", "by", "transport", "time", "prev", "hash"}, strings
    assert verify_chain(state).ok


def test_a_pacs_that_is_down_is_audited_as_not_sent(hospital, tmp_path):
    out = tmp_path / "out"
    _results(hospital.site_dir, out)
    cohort_file = hospital.cohort_file("dicomweb", name="audit-down")
    port = hospital.orthanc.http_port
    cohort_file.write_text(cohort_file.read_text().replace(f":{port}", f":{free_port()}"))
    state = tmp_path / "state"
    state.mkdir()
    report = store_audited(load_cohort(cohort_file), out, state, io.StringIO())
    assert report.stored == 0
    (record,) = _store_records(state)
    assert (record["stored"], record["not-sent"], record["not-stored-SEG"],
            record["not-stored-SR"], record["stored-bytes"]) == (0, 2, 1, 1, 0)
    assert verify_chain(state).ok


def test_store_to_needs_the_sites_state_folder(hospital, tmp_path, capsys):
    cohort_file = hospital.cohort_file(name="no-state")
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[pacs]\nendpoints = ["{load_cohort(cohort_file).endpoint}"]\n'
                      "write-back = true\n")
    out = tmp_path / "out"
    base = ["--model", str(tmp_path / "no-model"), "--data", str(hospital.site_dir),
            "--out", str(out), "--store-to", str(cohort_file), "--policy", str(policy)]
    assert predict_main(base) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--store-to needs --state" in line
    assert predict_main([*base, "--state", str(tmp_path / "missing")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"--state {tmp_path / 'missing'}: no such folder" in line
    assert not out.exists()  # refused before any prediction
