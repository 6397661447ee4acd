"""Results back to a real Orthanc (issue 48, 5): make predict's SEG and SR stored by STOW-RS
and by C-STORE are found by QIDO-RS afterwards and read back equal with highdicom; refused
without the site policy's consent (one line naming pacs.write-back); a PACS that is down, or an
object that fails, gives one line and loses nothing (the files stay in OUT/dicom)."""

from __future__ import annotations

from io import BytesIO

from pathlib import Path

import highdicom as hd
import numpy as np
import pydicom
import pytest

from app.predict import main as predict_main
from app.prediction.dicom_output import DicomResults, written_files
from app.tooling.environment import free_port
from clients.io.dicom_series import read_dicom_series
from clients.pacs.cohort import load_cohort
from clients.pacs.store import check_write_back, store_results
from clients.pacs.transport import open_transport
from clients.pe_seg.manifest import read_manifest
from clients.prediction.dicom_seg import SegmentationContent
from clients.prediction.dicom_source import ModelIdentity
from clients.prediction.dicom_sr import EvaluationContent
from clients.prediction.items import PredictionItem
from clients.site.policy import PolicyRefusal, load_policy

IDENTITY = ModelIdentity("fedmed-pe-seg-best", "3", "0.1.0")
ROOT = Path(__file__).resolve().parents[2]


def _results(site_dir: Path, out: Path) -> tuple[Path, Path]:
    """A SEG and an SR over the site's first series, written as make predict writes them."""
    series = read_manifest(site_dir)[0].image_dir
    mask = np.zeros(read_dicom_series(series).shape, np.uint8)
    mask[1:3, 8:20, 10:24] = 1
    out.mkdir(parents=True)
    results = DicomResults(out, IDENTITY)
    results.write(PredictionItem("study-a", series), SegmentationContent(mask, series))
    results.write(PredictionItem("study-a", series), EvaluationContent((0.73,), series))
    results.finish()
    seg, sr = written_files(out)
    return seg, sr


def _fetched(hospital, local: pydicom.Dataset) -> pydicom.Dataset:
    """The object with ``local``'s UIDs, found by QIDO-RS and fetched by WADO-RS."""
    web = open_transport(load_cohort(hospital.cohort_file("dicomweb", name="readback")))
    try:
        assert local.SOPInstanceUID in web.instance_uids(local.StudyInstanceUID, local.SeriesInstanceUID)
        found: list[pydicom.Dataset] = []
        web.fetch(local.StudyInstanceUID, local.SeriesInstanceUID, [local.SOPInstanceUID],
                  lambda raw: found.append(pydicom.dcmread(BytesIO(raw))))
    finally:
        web.close()
    return found[0]


@pytest.mark.parametrize("transport", ["dicomweb", "dimse"])
def test_the_seg_and_the_sr_are_stored_and_read_back_equal(own_hospital, tmp_path, transport):
    seg_file, sr_file = _results(own_hospital.site_dir, tmp_path / "out")
    cohort = load_cohort(own_hospital.cohort_file(transport, name=f"store-{transport}"))
    report = store_results(cohort, [seg_file, sr_file])
    assert (report.stored, report.failed, report.stopped) == (2, {}, "")
    where = (f"STOW-RS {own_hospital.orthanc.dicomweb_url}" if transport == "dicomweb" else
             f"C-STORE HOSPITAL01@127.0.0.1:{own_hospital.orthanc.dicom_port} from FEDMED")
    assert report.lines() == [f"stored 2 of 2 DICOM object(s) to {where}"]
    local_seg, local_sr = hd.seg.segread(seg_file), hd.sr.srread(sr_file)
    seg = hd.seg.Segmentation.from_dataset(_fetched(own_hospital, local_seg))
    sources = [ref.ReferencedSOPInstanceUID for ref in local_seg.ReferencedSeriesSequence[0]
               .ReferencedInstanceSequence]
    np.testing.assert_array_equal(seg.get_pixels_by_source_instance(sources, segment_numbers=[1]),
                                  local_seg.get_pixels_by_source_instance(sources, segment_numbers=[1]))
    assert seg.SegmentSequence[0].SegmentationAlgorithmIdentificationSequence[0].AlgorithmName \
        == "fedmed-pe-seg-best"
    sr = hd.sr.Comprehensive3DSR.from_dataset(_fetched(own_hospital, local_sr))
    (group,) = hd.sr.MeasurementReport.from_sequence([sr]).get_image_measurement_groups()
    assert float(group.get_measurements()[0].value) == pytest.approx(0.73)
    assert sr == local_sr  # stored as it was written, attribute for attribute


@pytest.mark.parametrize("transport", ["dicomweb", "dimse"])
def test_a_pacs_that_is_down_stops_the_store_in_one_line_and_loses_nothing(hospital, tmp_path, transport):
    files = _results(hospital.site_dir, tmp_path / "out")
    cohort_file = hospital.cohort_file(transport, name=f"down-{transport}")
    port = hospital.orthanc.http_port if transport == "dicomweb" else hospital.orthanc.dicom_port
    cohort_file.write_text(cohort_file.read_text().replace(f":{port}", f":{free_port()}")
                           .replace(f"port = {port}", f"port = {free_port()}"))
    report = store_results(load_cohort(cohort_file), list(files))
    assert (report.stored, report.not_sent, report.failed) == (0, 2, {})
    stop, summary = report.lines()
    assert stop.startswith(f"store stopped: {files[0].name}: ") and "(after 3 attempts)" in stop
    assert summary.endswith("; 2 not stored stay in their folder")
    assert all(path.is_file() for path in files)


def test_an_object_that_fails_is_named_and_the_others_are_stored(own_hospital, tmp_path):
    seg_file, sr_file = _results(own_hospital.site_dir, tmp_path / "out")
    broken = tmp_path / "out" / "dicom" / "broken.sr.dcm"
    broken.write_bytes(b"not DICOM")
    report = store_results(load_cohort(own_hospital.cohort_file("dimse", name="some")),
                           [seg_file, broken, sr_file])
    assert report.stored == 2 and list(report.failed) == [str(broken)]
    failed, summary = report.lines()
    assert failed.startswith(f"not stored: {broken}: unreadable") and "\n" not in failed
    assert summary.startswith("stored 2 of 3 DICOM object(s)")


def test_storing_needs_the_site_policys_consent(hospital, tmp_path, capsys):
    cohort_file = hospital.cohort_file(name="refused")
    cohort = load_cohort(cohort_file)
    with pytest.raises(PolicyRefusal, match=r"^policy rule pacs.write-back: "):
        check_write_back(load_policy(ROOT / "configs" / "site-policy.toml"), cohort)
    consenting = tmp_path / "policy.toml"
    consenting.write_text(f'[pacs]\nendpoints = ["{cohort.endpoint}"]\nwrite-back = true\n')
    check_write_back(load_policy(consenting), cohort)
    elsewhere = load_cohort(hospital.cohort_file("dimse", name="elsewhere"))
    with pytest.raises(PolicyRefusal, match=r"^policy rule pacs.endpoints: "):
        check_write_back(load_policy(consenting), elsewhere)
    out = tmp_path / "out"
    status = predict_main(["--model", str(tmp_path / "no-model"), "--data", str(hospital.site_dir),
                           "--out", str(out), "--store-to", str(cohort_file),
                           "--policy", str(ROOT / "configs" / "site-policy.toml"),
                           "--state", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "policy rule pacs.write-back" in err[0]
    assert not out.exists()  # refused before any prediction
