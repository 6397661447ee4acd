"""Bad input against a real Orthanc: each gives one line naming the study or the rule."""

from __future__ import annotations

import numpy as np
import pydicom
import pytest
from pydicom.uid import generate_uid

from app.tooling.environment import free_port
from clients.io.dicom_series import list_series_files
from clients.pacs.cohort import load_cohort
from clients.pacs.errors import CohortError, PacsError
from clients.pacs.sync import sync_cohort, store_dir
from clients.pe_seg.manifest import read_manifest


def _study_uid(row) -> str:
    return str(pydicom.dcmread(list_series_files(row.image_dir)[0]).StudyInstanceUID)


def test_a_pacs_that_is_down_stops_the_sync_and_keeps_what_was_synced(hospital, tmp_path):
    cohort_file = hospital.cohort_file(name="down")
    cohort = load_cohort(cohort_file)
    assert sync_cohort(cohort, tmp_path / "state").synced == 3
    manifest = (store_dir(cohort, tmp_path / "state") / "manifest.csv").read_text()
    down = cohort_file.read_text().replace(str(hospital.orthanc.http_port), str(free_port()))
    cohort_file.write_text(down)
    with pytest.raises(PacsError, match=r"DICOMweb http://127.0.0.1:\d+/dicom-web QIDO studies: "
                                         r"ConnectionError \(after 3 attempts\)"):
        sync_cohort(load_cohort(cohort_file), tmp_path / "state")
    assert (store_dir(cohort, tmp_path / "state") / "manifest.csv").read_text() == manifest


def test_wrong_credentials_are_named(hospital, tmp_path):
    secret = tmp_path / "wrong.toml"
    secret.write_text('username = "fedmed"\npassword = "not-it"\n')
    cohort_file = hospital.cohort_file(name="creds")
    cohort_file.write_text(cohort_file.read_text().replace(str(hospital.orthanc.credentials_file),
                                                           str(secret)))
    with pytest.raises(PacsError, match=r"QIDO studies: HTTP 401 \(wrong credentials\?\)"):
        sync_cohort(load_cohort(cohort_file), tmp_path / "state")


@pytest.mark.parametrize("transport", ["dicomweb", "dimse"])
def test_a_query_matching_nothing_is_refused(hospital, tmp_path, transport):
    cohort = load_cohort(hospital.cohort_file(transport, name=f"none-{transport}",
                                              extra="[query]\ndate-from = 2030-01-01\n"))
    with pytest.raises(PacsError, match="the query matches no study in the PACS"):
        sync_cohort(cohort, tmp_path / "state")
    assert not (store_dir(cohort, tmp_path / "state") / "manifest.csv").exists()


def test_a_dimse_sync_from_an_unknown_ae_title_is_refused(hospital, tmp_path):
    cohort_file = hospital.cohort_file("dimse", name="stranger")
    cohort_file.write_text(cohort_file.read_text().replace('calling-aet = "FEDMED"',
                                                           'calling-aet = "STRANGER"'))
    with pytest.raises(PacsError, match="rejected the association from AE title STRANGER"):
        sync_cohort(load_cohort(cohort_file), tmp_path / "state")


def _second_series(orthanc, row, tmp_path, thickness: str | None = None) -> None:
    """Upload a copy of ``row``'s series as a second CT series of the same study."""
    series_uid = generate_uid()
    folder = tmp_path / "copy"
    folder.mkdir(exist_ok=True)
    for k, path in enumerate(list_series_files(row.image_dir)):
        ds = pydicom.dcmread(path)
        ds.SeriesInstanceUID = series_uid
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        ds.SeriesNumber = 2
        if thickness:
            ds.SliceThickness = thickness
        ds.save_as(folder / f"{k}.dcm")
    orthanc.upload(sorted(folder.iterdir()))


def test_two_ct_series_with_the_same_slices_skip_the_study(own_hospital, tmp_path):
    row = read_manifest(own_hospital.site_dir)[0]
    _second_series(own_hospital.orthanc, row, tmp_path)
    uid = _study_uid(row)
    report = sync_cohort(load_cohort(own_hospital.cohort_file()), tmp_path / "state")
    assert report.synced == 2
    assert report.skipped == {uid: f"study {uid}: 2 CT series matching description '*' with the "
                                   "same thinnest slices (" + str(float(pydicom.dcmread(
                                       list_series_files(row.image_dir)[0]).SliceThickness))
                                   + " mm); series.choose = 'thinnest' cannot pick one"}
    single = load_cohort(own_hospital.cohort_file(name="single", extra='[series]\nchoose = "single"\n'))
    assert sync_cohort(single, tmp_path / "state").skipped == {
        uid: f"study {uid}: 2 CT series matching description '*' (series.choose = 'single')"}


def test_of_two_ct_series_the_thinnest_is_chosen(own_hospital, tmp_path):
    row = read_manifest(own_hospital.site_dir)[0]
    _second_series(own_hospital.orthanc, row, tmp_path, thickness="9.5")
    report = sync_cohort(load_cohort(own_hospital.cohort_file()), tmp_path / "state")
    assert (report.synced, report.skipped) == (3, {})


def test_a_label_naming_a_study_not_in_the_pacs_is_reported(hospital, tmp_path):
    out = tmp_path / "hospital"
    out.mkdir()
    text = (hospital.out_dir / "labels.csv").read_text()
    mask = str(read_manifest(hospital.site_dir)[0].mask_path)
    (out / "labels.csv").write_text(text + f"1.2.3.999,train,{mask},ghost\n")
    (out / "ghost.toml").write_text(hospital.cohort_file(name="ghost").read_text())
    report = sync_cohort(load_cohort(out / "ghost.toml"), tmp_path / "state")
    assert report.synced == 3
    assert report.skipped == {"1.2.3.999": "study 1.2.3.999: named by labels.csv line 5 but not in the PACS"}


def test_a_series_with_a_missing_slice_is_skipped_naming_the_gap(own_hospital, site_dir, tmp_path):
    row = read_manifest(site_dir)[1]
    uid = _study_uid(row)
    own_hospital.orthanc.delete_study(uid)
    files = list_series_files(row.image_dir)
    z = [float(pydicom.dcmread(p).ImagePositionPatient[2]) for p in files]
    middle = files[int(np.argsort(z)[len(z) // 2])]
    own_hospital.orthanc.upload([p for p in files if p != middle])
    report = sync_cohort(load_cohort(own_hospital.cohort_file()), tmp_path / "state")
    assert report.synced == 2 and list(report.skipped) == [uid]
    assert report.skipped[uid].startswith(f"study {uid}: gaps in the slices or bad geometry (missing slice(s)")


def test_a_cohort_file_error_names_the_file_and_the_key(hospital, tmp_path):
    bad = hospital.cohort_file(name="bad", extra='retry = 3\n')
    with pytest.raises(CohortError, match=rf"cohort file {bad}: key 'sync.retry' is not a cohort key"):
        load_cohort(bad)
    bad.write_text(bad.read_text().replace("retry = 3\n", "").replace('key = "study-instance-uid"',
                                                                       'key = "patient-id"'))
    with pytest.raises(CohortError, match=r"key 'labels.key' must be one of study-instance-uid, "
                                          "accession-number, got 'patient-id'"):
        load_cohort(bad)
    for parallel in (0, 33):
        bad = hospital.cohort_file(name="bad-parallel", extra=f"parallel = {parallel}\n")
        with pytest.raises(CohortError, match=rf"key 'sync.parallel' must be 1 to 32 studies at a "
                                              rf"time, got {parallel}$"):
            load_cohort(bad)
