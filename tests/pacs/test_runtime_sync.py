"""The site policy governs the PACS: the runtime syncs, under ``[pacs]``, audited, outside the worker's view."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pydicom
import pytest

from app.site_runtime.audit_chain import verify_chain
from app.site_runtime.audit_log import AuditLog
from app.site_runtime.one_policy import node_config_of
from app.site_runtime.pacs_sync import CohortSyncs, start_sync, sync_site
from app.site_runtime.sandbox import (SandboxLimits, WorkerMounts, bubblewrap, sandboxed_command,
                                      worker_owner)
from app.site_runtime.site_audit import SiteAudit
from app.site_runtime.site_runner import SiteRunner
from app.site_runtime.supernode import SuperNodeProcess, node_config_string
from app.site_runtime.worker_view import data_rules_toml, prepare_worker_state, worker_context
from app.tooling.errors import FlowerProcessError
from app.tooling.layout import DeployLayout
from clients.io.dicom_series import list_series_files
from clients.pacs.cohort import load_cohort
from clients.pacs.dicomweb import DicomWebTransport
from clients.pacs.errors import CohortError
from clients.pacs.sync import store_dir
from clients.pe_seg.manifest import read_manifest
from clients.site.policy import PolicyRefusal, load_policy
from flwr.app import Context, RecordDict


def policy(tmp_path: Path, pacs: str) -> object:
    path = tmp_path / "policy.toml"
    path.write_text(f"[pacs]\n{pacs}\n", encoding="utf-8")
    return load_policy(path)


def pacs_records(state: Path) -> list[dict]:
    return [r for r in AuditLog(state).records() if r["kind"] == "pacs-sync"]


def identifiers(site_dir: Path) -> set[str]:
    """Every UID, accession number and patient name of the hospital's studies."""
    found = set()
    for row in read_manifest(site_dir):
        for file in list_series_files(row.image_dir):
            ds = pydicom.dcmread(file, stop_before_pixels=True)
            found |= {ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.SOPInstanceUID}
            found |= {str(v) for v in (ds.get("AccessionNumber"), ds.get("PatientName"),
                                       ds.get("PatientID")) if v}
    return found


def test_an_endpoint_the_policy_does_not_list_is_refused_before_any_contact(hospital, tmp_path):
    cohort = hospital.cohort_file(name="refused-endpoint")
    rules = policy(tmp_path, 'endpoints = ["http://127.0.0.1:1/dicom-web", "OTHER@127.0.0.1:104"]')
    state = tmp_path / "state"
    with pytest.raises(PolicyRefusal) as refused:
        sync_site(cohort, state, rules, SiteAudit(state, "hospital-a"))
    assert refused.value.rule == "pacs.endpoints"
    assert not store_dir(load_cohort(cohort), state).exists()  # nothing fetched
    assert [r.get("refused") for r in pacs_records(state)] == ["pacs.endpoints"]
    config = {"cohort": str(cohort)}
    with pytest.raises(FlowerProcessError, match=r"^site_node: policy rule pacs\.endpoints: [^\n]*$"):
        start_sync(config, state, rules, None)
    empty = policy(tmp_path, "max-cohort = 10")  # a [pacs] without endpoints: no PACS
    with pytest.raises(PolicyRefusal, match="pacs.endpoints"):
        sync_site(cohort, state, empty, None)


def test_a_dimse_peer_is_named_aet_at_host_port(hospital, tmp_path):
    cohort = load_cohort(hospital.cohort_file("dimse", name="dimse-endpoint"))
    peer = f"{hospital.orthanc.aet}@127.0.0.1:{hospital.orthanc.dicom_port}"
    assert cohort.endpoint == peer
    policy(tmp_path, f'endpoints = ["{peer}"]').pacs.check_endpoint(cohort.endpoint)


def store_snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file of a store: its size and mtime (ns)."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*") if p.is_file()}


def test_a_cohort_over_max_cohort_is_refused_for_the_whole_federation(hospital, tmp_path):
    cohort = hospital.cohort_file(name="too-large")
    rules = policy(tmp_path, f'endpoints = ["{hospital.orthanc.dicomweb_url}/"]\nmax-cohort = 2')
    state = tmp_path / "state"
    syncs = CohortSyncs()
    refused = syncs.for_run(1, {"cohort": str(cohort)}, state, rules, SiteAudit(state, "h"))
    assert refused is not None and refused.rule == "pacs.max-cohort"
    assert "3 studies, more than the policy's max-cohort 2" in str(refused)
    assert syncs.for_run(1, {"cohort": str(cohort)}, state, rules, None) is refused  # no re-sync
    assert [r.get("refused") for r in pacs_records(state)] == ["pacs.max-cohort"]
    assert pacs_records(state)[0]["studies-in-pacs"] == 3
    data = store_dir(load_cohort(cohort), state)
    assert not data.exists()  # refused after the query: not one instance fetched


def test_max_cohort_is_checked_before_any_download_and_keeps_the_store(hospital, tmp_path):
    cohort = hospital.cohort_file(name="shrunk-limit")
    url = hospital.orthanc.dicomweb_url
    state = tmp_path / "state"
    assert sync_site(cohort, state, policy(tmp_path, f'endpoints = ["{url}"]'), None).synced == 3
    data = store_dir(load_cohort(cohort), state)
    before = store_snapshot(data)
    asked = []
    rules = policy(tmp_path, f'endpoints = ["{url}"]\nmax-cohort = 2')
    with pytest.MonkeyPatch.context() as patch:
        for name in ("find_series", "instance_uids", "fetch"):  # every request after the query
            patch.setattr(DicomWebTransport, name,
                          lambda self, *args, name=name: asked.append(name))
        with pytest.raises(PolicyRefusal, match=r"^policy rule pacs\.max-cohort: the cohort holds "
                                                r"3 studies, more than the policy's max-cohort 2"):
            sync_site(cohort, state, rules, None)
    assert asked == [] and store_snapshot(data) == before


def test_each_sync_is_audited_with_counts_and_no_identifier(hospital, tmp_path):
    cohort = hospital.cohort_file(name="audited")
    rules = policy(tmp_path, f'endpoints = ["{hospital.orthanc.dicomweb_url}"]\nmax-cohort = 3')
    state = tmp_path / "state"
    audit = SiteAudit(state, "hospital-a")
    first = sync_site(cohort, state, rules, audit)
    sync_site(cohort, state, rules, audit)
    records = pacs_records(state)
    assert [(r["synced"], r["fetched-studies"], r["skipped"], r["removed"]) for r in records] == [
        (3, 3, 0, 0), (3, 0, 0, 0)]
    assert records[0]["fetched-instances"] == first.fetched_instances
    assert records[0]["fetched-bytes"] == first.fetched_bytes > 0
    text = json.dumps(records)
    assert not [i for i in identifiers(hospital.site_dir) if i in text]
    assert "refused" not in records[0] and str(cohort) not in text
    assert verify_chain(state).ok


def test_the_worker_sees_the_synced_folder_and_never_the_cohort_or_credentials(hospital, tmp_path):
    cohort_path = hospital.cohort_file(name="view")
    state = tmp_path / "state"
    data = store_dir(load_cohort(cohort_path), state)
    node_config = node_config_of(["--node-config", node_config_string(
        data, state, "hospital-a", tmp_path / "policy.toml", cohort=cohort_path)])
    assert (node_config["data-path"], node_config["cohort"]) == (str(data), str(cohort_path))
    rules = policy(tmp_path, f'endpoints = ["{hospital.orthanc.dicomweb_url}"]')
    assert start_sync(node_config, state, rules, None, SandboxLimits()).synced == 3
    context = Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(),
                      run_config={})
    worker = worker_context(context, state, tmp_path / "copy.toml")
    secrets = (str(cohort_path), str(hospital.orthanc.credentials_file))
    assert "cohort" not in worker.node_config
    assert not [v for v in worker.node_config.values() if any(s in str(v) for s in secrets)]
    assert "[pacs]" not in data_rules_toml(rules)
    bubblewrap()  # the worker's view, as the sandbox builds it: the data, not the secrets
    (tmp_path / "app").mkdir()
    for name in ("copy.toml", "worker.py"):
        (tmp_path / name).write_text("", encoding="utf-8")
    worker_state = prepare_worker_state(state, worker_owner(SandboxLimits()))
    assert data.is_dir()  # the runtime's store stays where it is
    mounts = WorkerMounts(data, state, worker_state, tmp_path / "app",
                          tmp_path, tmp_path / "copy.toml", tmp_path / "worker.py")
    code = ("import os, sys; print(len(open(sys.argv[1]).read().splitlines()), "
            "*[os.path.exists(path) for path in sys.argv[2:]])")
    command = sandboxed_command([sys.executable, "-c", code, str(data / "manifest.csv"),
                                 *secrets], mounts, SandboxLimits(max_memory=0), {})
    seen = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert (seen.returncode, seen.stdout.split()) == (0, ["4", "False", "False"]), seen.stderr


def test_a_study_added_to_the_pacs_joins_the_next_federation(own_hospital, tmp_path):
    newcomer = read_manifest(own_hospital.site_dir)[-1]
    files = list_series_files(newcomer.image_dir)
    own_hospital.orthanc.delete_study(pydicom.dcmread(files[0]).StudyInstanceUID)
    cohort = own_hospital.cohort_file()
    rules = policy(tmp_path, f'endpoints = ["{own_hospital.orthanc.dicomweb_url}"]')
    state = tmp_path / "state"
    data = store_dir(load_cohort(cohort), state)
    runner = SiteRunner("127.0.0.1:1", tmp_path / "policy.toml")  # the runner's own hook
    node_config = node_config_of(["--node-config", node_config_string(
        data, state, "hospital-a", tmp_path / "policy.toml", cohort=cohort)])

    def first_message_of(run_id: int) -> object:
        context = Context(run_id=run_id, node_id=7, node_config=node_config,
                          state=RecordDict(), run_config={})
        return runner._cohort_refusal(run_id, context, rules)  # pylint: disable=W0212

    assert first_message_of(1) is None
    assert len(read_manifest(data)) == 2
    own_hospital.orthanc.upload(files)
    assert first_message_of(1) is None  # the same federation: no sync
    assert len(read_manifest(data)) == 2 and len(pacs_records(state)) == 1
    assert first_message_of(2) is None
    assert len(read_manifest(data)) == 3
    assert [(r["synced"], r["fetched-studies"]) for r in pacs_records(state)] == [(2, 2), (3, 1)]
    if os.geteuid() == 0:  # the sandboxed worker's uid can read what the runtime synced
        uid = SandboxLimits().worker_uid
        assert {p.stat().st_uid for p in (data, *data.rglob("*"))} == {uid}


def test_a_supernode_is_started_with_its_cohort_file_as_its_data(hospital, tmp_path):
    cohort = hospital.cohort_file(name="started")
    layout, rules = DeployLayout(tmp_path / "deploy"), tmp_path / "policy.toml"
    rules.write_text("[pacs]\nendpoints = [\"*\"]\n", encoding="utf-8")
    with pytest.raises(FlowerProcessError, match="synced by the site runner"):
        SuperNodeProcess.start(layout, "hospital-a", "127.0.0.1:1", cohort, policy=rules,
                               runner="flower")
    with pytest.raises(FlowerProcessError, match="missing the SuperNode key"):  # past the data
        SuperNodeProcess.start(layout, "hospital-a", "127.0.0.1:1", cohort, policy=rules)
    (tmp_path / "bad.toml").write_text('name = "bad"\n', encoding="utf-8")
    with pytest.raises(CohortError, match="bad.toml: key 'pacs'"):
        SuperNodeProcess.start(layout, "hospital-a", "127.0.0.1:1", tmp_path / "bad.toml",
                               policy=rules)
