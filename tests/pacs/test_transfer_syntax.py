"""Transfer syntaxes found in a PACS (issue 48, bad input), against a real Orthanc: a series in a
syntax no maintained pydicom plugin decodes (unknown to pydicom, or one it has no decoder for)
skips its study in one line naming the syntax, the other studies are synced; a compressed series
(JPEG 2000, encoded here by pylibjpeg-openjpeg) is synced over DICOMweb and DIMSE and decoded by
the maintained plugins to the very voxels of the uncompressed source; a JPEG baseline one (8-bit,
lossy, encoded here by Pillow) to the voxels of the series as the PACS holds it."""

from __future__ import annotations

from io import BytesIO
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.encaps import encapsulate
from pydicom.pixels import get_decoder, get_encoder
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


def _jpeg_baseline_series(row, folder: Path) -> list[Path]:
    """``row``'s series as 8-bit JPEG baseline (1.2.840.10008.1.2.4.50), as a PACS that
    compresses lossily holds it: HU windowed to 0..255 (RescaleSlope 16, RescaleIntercept
    -1024), each frame encoded by Pillow (pydicom's plugins have no JPEG baseline encoder;
    decoding it is pylibjpeg-libjpeg's)."""
    from PIL import Image
    folder.mkdir()
    for k, path in enumerate(list_series_files(row.image_dir)):
        ds = pydicom.dcmread(path)
        hu = ds.pixel_array.astype(np.float64) * float(ds.RescaleSlope) + float(ds.RescaleIntercept)
        stored = np.clip(np.round((hu + 1024.0) / 16.0), 0, 255).astype(np.uint8)
        frame = BytesIO()
        Image.fromarray(stored, mode="L").save(frame, format="JPEG", quality=90)
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
        ds.RescaleSlope, ds.RescaleIntercept = 16, -1024
        ds.PhotometricInterpretation = "MONOCHROME2"
        ds.LossyImageCompression = "01"
        ds.PixelData = encapsulate([frame.getvalue()])
        ds["PixelData"].VR = "OB"
        ds.file_meta.TransferSyntaxUID = JPEGBaseline8Bit
        ds.save_as(folder / f"{k}.dcm", enforce_file_format=True)
    return sorted(folder.iterdir())


@pytest.mark.parametrize("transport", ["dicomweb", "dimse"])
def test_a_jpeg_baseline_series_is_synced_and_decoded_by_the_maintained_plugin(
        own_hospital, tmp_path, transport):
    if not get_decoder(JPEGBaseline8Bit).is_available:
        pytest.fail("no JPEG baseline decoder: pylibjpeg-libjpeg is a pinned dependency")
    row = read_manifest(own_hospital.site_dir)[2]
    uid = str(pydicom.dcmread(list_series_files(row.image_dir)[0], stop_before_pixels=True)
              .StudyInstanceUID)
    own_hospital.orthanc.delete_study(uid)
    jpeg = _jpeg_baseline_series(row, tmp_path / "jpeg-baseline")
    own_hospital.orthanc.upload(jpeg)
    cohort = load_cohort(own_hospital.cohort_file(transport, name=f"jpeg-{transport}"))
    report = sync_cohort(cohort, tmp_path / "state")
    assert (report.synced, report.skipped) == (3, {})
    synced = {r.study_id: r for r in read_manifest(store_dir(cohort, tmp_path / "state"))}[row.study_id]
    assert {str(pydicom.dcmread(p, stop_before_pixels=True).file_meta.TransferSyntaxUID)
            for p in list_series_files(synced.image_dir)} == {JPEGBaseline8Bit}
    got = read_dicom_series(synced.image_dir).hu
    np.testing.assert_array_equal(got, read_dicom_series(jpeg[0].parent).hu)  # what was stored
    source = read_dicom_series(row.image_dir).hu
    # lossy: within 3 stored steps (16 HU each) on average on these noisy slices; a wrong
    # rescale or a garbled decode is off by hundreds
    assert np.abs(got - np.clip(source, -1024, 3056)).mean() < 48


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
