"""Transfer syntaxes found in a PACS (issue 48, bad input), against a real Orthanc: a series in a
syntax no maintained pydicom plugin decodes (unknown to pydicom, or one it has no decoder for)
skips its study in one line naming the syntax, the other studies are synced; a compressed series
(JPEG 2000, encoded here by pylibjpeg-openjpeg) is synced over DICOMweb and DIMSE and decoded by
the maintained plugins to the very voxels of the uncompressed source."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.encaps import encapsulate
from pydicom.pixels import get_encoder
from pydicom.uid import JPEG2000Lossless, MPEG2MPML, UID, JPEGBaseline8Bit

from clients.io.dicom_series import list_series_files, read_dicom_series
from clients.pacs.cohort import load_cohort
from clients.pacs.sync import store_dir, sync_cohort
from clients.pe_seg.manifest import read_manifest

#: A transfer syntax UID no standard defines (a site-private one pydicom cannot know).
UNKNOWN = UID("1.2.826.0.1.3680043.10.1234.99")


def _replace_series(orthanc, row, tmp_path: Path, syntax: UID, compress: bool) -> str:
    """Put ``row``'s study back into ``orthanc`` with its series in ``syntax``; its StudyInstanceUID."""
    files = list_series_files(row.image_dir)
    uid = str(pydicom.dcmread(files[0], stop_before_pixels=True).StudyInstanceUID)
    orthanc.delete_study(uid)
    folder = tmp_path / f"series-{syntax}"
    folder.mkdir()
    for k, path in enumerate(files):
        ds = pydicom.dcmread(path)
        if compress:
            ds.compress(syntax)
        else:  # the pixel bytes wrapped as if encoded: only the syntax is foreign
            ds.PixelData = encapsulate([ds.PixelData])
            ds["PixelData"].VR = "OB"
            ds.file_meta.TransferSyntaxUID = syntax
        ds.save_as(folder / f"{k}.dcm", enforce_file_format=True)
    orthanc.upload(sorted(folder.iterdir()))
    return uid


@pytest.mark.parametrize("syntax", [UNKNOWN, MPEG2MPML], ids=["unknown", "mpeg2"])
def test_a_series_in_a_syntax_no_plugin_decodes_skips_its_study_in_one_line(
        own_hospital, tmp_path, syntax):
    row = read_manifest(own_hospital.site_dir)[0]
    uid = _replace_series(own_hospital.orthanc, row, tmp_path, syntax, compress=False)
    cohort = load_cohort(own_hospital.cohort_file(name="foreign"))
    report = sync_cohort(cohort, tmp_path / "state")
    assert report.synced == 2
    assert report.skipped == {uid: f"study {uid}: unsupported transfer syntax {syntax} ({syntax.name})"}
    again = sync_cohort(cohort, tmp_path / "state")  # the next sync still skips it, keeps the rest
    assert (again.synced, list(again.skipped)) == (2, [uid])


def test_jpeg_baseline_is_not_encoded_here():
    """JPEG baseline needs an encoder pydicom's plugins do not have (decoding it is pylibjpeg-libjpeg's)."""
    try:
        get_encoder(JPEGBaseline8Bit)
    except NotImplementedError as exc:
        pytest.skip(f"no JPEG baseline encoder to make a test series ({exc}); JPEG 2000 is tested")
    pytest.fail("pydicom now has a JPEG baseline encoder: add it to the compressed-series test")


@pytest.mark.parametrize("transport", ["dicomweb", "dimse"])
def test_a_jpeg_2000_series_is_synced_and_decoded_to_the_source_voxels(own_hospital, tmp_path, transport):
    if not get_encoder(JPEG2000Lossless).is_available:
        pytest.skip("pylibjpeg-openjpeg cannot encode JPEG 2000 here")
    row = read_manifest(own_hospital.site_dir)[1]
    uid = _replace_series(own_hospital.orthanc, row, tmp_path, JPEG2000Lossless, compress=True)
    cohort = load_cohort(own_hospital.cohort_file(transport, name=f"j2k-{transport}"))
    report = sync_cohort(cohort, tmp_path / "state")
    assert (report.synced, report.skipped) == (3, {})
    synced = {r.study_id: r for r in read_manifest(store_dir(cohort, tmp_path / "state"))}[row.study_id]
    stored = list_series_files(synced.image_dir)
    assert {str(pydicom.dcmread(p, stop_before_pixels=True).file_meta.TransferSyntaxUID)
            for p in stored} == {JPEG2000Lossless}  # kept as the PACS holds it
    assert uid == str(pydicom.dcmread(stored[0], stop_before_pixels=True).StudyInstanceUID)
    np.testing.assert_array_equal(read_dicom_series(synced.image_dir).hu,
                                  read_dicom_series(row.image_dir).hu)
