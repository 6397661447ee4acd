"""The PACS sync against a real Orthanc: the folder loader's manifest, incremental, resumable, DIMSE."""

from __future__ import annotations

import csv
import json
import stat

import numpy as np
import pydicom
import pytest

import clients.pacs.dimse as dimse
from clients.io.dicom_series import list_series_files
from clients.pacs.cohort import load_cohort
from clients.pacs.sync import sync_cohort, store_dir
from clients.pacs.transport import open_transport
from clients.pe_seg.data import load_site
from clients.pe_seg.manifest import read_manifest


def assert_same_site(folder, store) -> None:
    """The store loads to the folder's studies: ids, splits, HU volumes, masks, spacing."""
    expected, _ = load_site(folder)
    got, report = load_site(store)
    assert report.skipped == {}
    assert [(i.study_id, i.split) for i in got] == [(i.study_id, i.split) for i in expected]
    for a, b in zip(expected, got):
        assert np.array_equal(a.hu, b.hu) and np.array_equal(a.mask, b.mask)
        assert a.spacing == b.spacing


@pytest.mark.parametrize("transport", ["dicomweb", "dimse"])
def test_a_sync_gives_the_manifest_the_folder_loader_reads(hospital, tmp_path, transport):
    cohort = load_cohort(hospital.cohort_file(transport, name=f"sync-{transport}"))
    report = sync_cohort(cohort, tmp_path / "state")
    store = store_dir(cohort, tmp_path / "state")
    assert (report.studies_in_pacs, report.synced, report.fetched_studies, report.skipped) == (3, 3, 3, {})
    assert report.fetched_instances == sum(len(list_series_files(r.image_dir))
                                           for r in read_manifest(hospital.site_dir))
    assert report.fetched_bytes > 0 and report.mb_per_s > 0
    assert stat.S_IMODE(store.stat().st_mode) == 0o700
    assert stat.S_IMODE(store.parent.stat().st_mode) == 0o700
    assert_same_site(hospital.site_dir, store)
    again = sync_cohort(cohort, tmp_path / "state")
    assert (again.synced, again.fetched_studies, again.fetched_instances) == (3, 0, 0)


def test_an_incremental_sync_fetches_only_the_new_study_and_drops_a_removed_one(own_hospital, tmp_path):
    rows = read_manifest(own_hospital.site_dir)
    newcomer = rows[-1]
    uid = pydicom.dcmread(list_series_files(newcomer.image_dir)[0]).StudyInstanceUID
    own_hospital.orthanc.delete_study(uid)
    cohort = load_cohort(own_hospital.cohort_file())
    first = sync_cohort(cohort, tmp_path / "state")
    assert (first.synced, first.fetched_studies) == (2, 2)
    assert first.skipped == {uid: f"study {uid}: named by labels.csv line 4 but not in the PACS"}
    own_hospital.orthanc.upload(list_series_files(newcomer.image_dir))
    second = sync_cohort(cohort, tmp_path / "state")
    assert (second.synced, second.fetched_studies, second.skipped) == (3, 1, {})
    assert second.fetched_instances == len(list_series_files(newcomer.image_dir))
    assert_same_site(own_hospital.site_dir, store_dir(cohort, tmp_path / "state"))
    gone = pydicom.dcmread(list_series_files(rows[0].image_dir)[0]).StudyInstanceUID
    own_hospital.orthanc.delete_study(gone)
    third = sync_cohort(cohort, tmp_path / "state")
    assert (third.synced, third.removed, third.fetched_instances) == (2, 1, 0)
    manifest = read_manifest(store_dir(cohort, tmp_path / "state"))
    assert [r.study_id for r in manifest] == [r.study_id for r in rows[1:]]


class Interrupted(Exception):
    """The test's stand-in for a sync killed mid-series."""


def test_an_interrupted_sync_resumes_fetching_only_what_it_lacks(hospital, tmp_path):
    cohort = load_cohort(hospital.cohort_file(name="resume"))
    transport = open_transport(cohort)
    fetch = transport.fetch
    stored = []

    def fetch_then_die(study_uid, series_uid, sop_uids, store):
        def counting(raw):
            if len(stored) == 7:
                raise Interrupted
            store(raw)
            stored.append(raw)
        fetch(study_uid, series_uid, sop_uids, counting)

    transport.fetch = fetch_then_die
    with pytest.raises(Interrupted):
        sync_cohort(cohort, tmp_path / "state", transport)
    assert not (store_dir(cohort, tmp_path / "state") / "manifest.csv").exists()
    report = sync_cohort(cohort, tmp_path / "state")
    total = sum(len(list_series_files(r.image_dir)) for r in read_manifest(hospital.site_dir))
    assert (report.synced, report.fetched_instances) == (3, total - 7)
    assert_same_site(hospital.site_dir, store_dir(cohort, tmp_path / "state"))


def test_the_index_forgets_a_study_the_label_csv_drops(hospital, tmp_path):
    labels = tmp_path / "hospital" / "labels.csv"
    labels.parent.mkdir()
    lines = (hospital.out_dir / "labels.csv").read_text().splitlines()
    labels.write_text("\n".join(lines) + "\n")
    cohort_file = hospital.cohort_file(name="drop").read_text()
    (tmp_path / "hospital" / "drop.toml").write_text(cohort_file)
    cohort = load_cohort(tmp_path / "hospital" / "drop.toml")
    assert sync_cohort(cohort, tmp_path / "state").synced == 3
    labels.write_text("\n".join(lines[:-1]) + "\n")
    report = sync_cohort(load_cohort(tmp_path / "hospital" / "drop.toml"), tmp_path / "state")
    dropped = next(csv.reader([lines[-1]]))[0]
    assert report.synced == 2 and report.skipped == {
        dropped: f"study {dropped}: missing label (not in labels.csv)"}


@pytest.mark.parametrize("transport", ["dicomweb", "dimse"])
def test_each_instance_is_kept_as_the_bytes_the_pacs_sent(hospital, tmp_path, transport):
    """The store holds what the PACS serves, not a re-encoding by pydicom: over DICOMweb the
    whole Part 10 file Orthanc serves; over DIMSE the data set the C-STORE sub-operation
    carried (the file meta is the receiving side's, PS3.10 7.1)."""
    cohort = load_cohort(hospital.cohort_file(transport, name=f"raw-{transport}"))
    sync_cohort(cohort, tmp_path / "state")
    stored = list_series_files(read_manifest(store_dir(cohort, tmp_path / "state"))[0].image_dir)
    assert len(stored) > 1
    orthanc = hospital.orthanc
    for path in stored:
        raw = path.read_bytes()
        uid = pydicom.dcmread(path, stop_before_pixels=True).SOPInstanceUID
        (item,) = json.loads(orthanc.request("/tools/lookup", data=uid.encode(), method="POST"))
        served = orthanc.request(f"/instances/{item['ID']}/file")
        if transport == "dicomweb":
            assert raw == served
        else:
            assert raw[_dataset_offset(raw):] == served[_dataset_offset(served):]


def _dataset_offset(raw: bytes) -> int:
    """Where a Part 10 file's data set starts: after the 128-byte preamble, ``DICM`` and the
    file meta group, whose first element (0002,0000) holds its length (PS3.10 7.1)."""
    assert raw[128:132] == b"DICM" and raw[132:136] == b"\x02\x00\x00\x00"
    return 144 + int.from_bytes(raw[140:144], "little")


def test_the_dimse_sync_acknowledges_what_it_receives_at_once(hospital):
    """Debian's Orthanc (DCMTK, Nagle's algorithm on) sends each C-GET sub-operation in two
    writes and waits for the first one's ACK, which Linux delays 40 ms: the sync's socket
    sets TCP_QUICKACK before each read (dimse._QuickAckSocket)."""
    transport = open_transport(load_cohort(hospital.cohort_file("dimse", name="quickack")))
    association = transport._associate()
    try:
        assert isinstance(association.dul.socket, dimse._QuickAckSocket)
    finally:
        association.release()


def test_a_sync_that_changes_nothing_leaves_the_manifest_as_it_was(hospital, tmp_path):
    """The runtime keys its warm worker by the manifest's mtime (runtime_round.data_version):
    a federation whose sync brought nothing new keeps the worker and its loaded data."""
    cohort = load_cohort(hospital.cohort_file(name="same-manifest"))
    sync_cohort(cohort, tmp_path / "state")
    manifest = store_dir(cohort, tmp_path / "state") / "manifest.csv"
    before = manifest.stat().st_mtime_ns
    again = sync_cohort(cohort, tmp_path / "state")
    assert (again.synced, again.fetched_studies) == (3, 0)
    assert manifest.stat().st_mtime_ns == before
