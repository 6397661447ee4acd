"""make predict's DICOM results (issue 48, 5): a DICOM-SEG per PE study and a TID 1500 SR per
classified DICOM item, read back with highdicom to the predicted mask and the CSV's numbers,
valid under Debian's dciodvfy; a source that is not DICOM or does not fit gets a one-line reason."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import highdicom as hd
import numpy as np
import pydicom
import pytest
import torch
from pydicom.sr.codedict import codes
from torch import nn

from app.model_source import LoggedModel
from app.predict import predict
from app.prediction.dicom_output import DicomResults, model_identity
from clients.ct3d_cls.synthetic import SiteProfile as CT3DProfile, generate_site as generate_ct3d_site
from clients.errors import DicomResultError
from clients.io.dicom_series import read_dicom_series
from clients.io.nifti import read_nifti_mask
from clients.pe_seg.synthetic import SiteProfile, generate_site as generate_pe_site
from clients.prediction.dicom_seg import SegmentationContent
from clients.prediction.dicom_source import ModelIdentity, read_source_instances
from clients.prediction.dicom_sr import EvaluationContent
from clients.prediction.items import PredictionItem
from clients.registry import task_class
from clients.training.site_task import TaskSettings
from clients.training.trainer import select_device
from tests.clients.small_sites import small_cxr_site
from tests.debian_tools import debian_tool

CPU = select_device("cpu")
PE_SETTINGS = TaskSettings(image_size=32, slab_slices=3)
CT3D_SETTINGS = TaskSettings(image_size=16, volume_depth=4)
IDENTITY = ModelIdentity("fedmed-test-best", "7", "0.1.0")


class _Bright(nn.Module):
    """PE logits from the centre slice's windowed intensity: a mask of the bright vessels."""

    def __init__(self, slab: int) -> None:
        super().__init__()
        self.centre = slab // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x[:, self.centre:self.centre + 1] - 0.6) * 20.0


class _MeanLogit(nn.Module):
    """Classifier logits from the input's mean (both classes among the items)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.flatten(1).mean(1, keepdim=True) - 0.45) * 20.0


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def dciodvfy() -> str:
    """Debian's dciodvfy (dicom3tools); skip without it, fail under CI (which installs it)."""
    return debian_tool("dciodvfy", "dicom3tools", "the DICOM results must be validated")


def _verify(path: Path) -> list[str]:
    """dciodvfy's report lines of ``path``; asserts none is an error."""
    done = subprocess.run([dciodvfy(), str(path)], capture_output=True, text=True, timeout=120)
    lines = (done.stdout + done.stderr).splitlines()
    errors = [line for line in lines if line.startswith("Error")]
    assert not errors, f"dciodvfy {path}:\n" + "\n".join(lines)
    return lines


@pytest.fixture(scope="module")
def pe_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    profile = SiteProfile(name="dicom-hospital", num_studies=2, noise_hu=20.0, contrast_hu=200.0,
                          slice_thickness_mm=(2.0, 3.0), num_slices=(6, 8))
    return generate_pe_site(tmp_path_factory.mktemp("pe") / "site", profile, seed=5, image_size=40)


def test_the_seg_reads_back_to_the_predicted_mask_and_references_every_source_slice(
        pe_site: Path, tmp_path: Path) -> None:
    logged = LoggedModel(_Bright(3).eval(), "pe-seg", PE_SETTINGS, False, "models:/fedmed-pe-seg-best/3")
    out = tmp_path / "out"
    predict(logged, pe_site, out, compute=CPU)
    findings = {r["id"]: r for r in _rows(out / "findings.csv")}
    index = _rows(out / "dicom.csv")
    assert [r["id"] for r in index] == list(findings) and all(r["kind"] == "SEG" for r in index)
    assert sum(int(r["voxels"]) for r in findings.values()) > 0  # the masks are not empty
    for row in index:
        series_dir = pe_site / findings[row["id"]]["image"]
        sources = read_source_instances(series_dir)
        mask = read_nifti_mask(out / findings[row["id"]]["mask"], reference=read_dicom_series(series_dir))
        seg = hd.seg.segread(out / row["file"])
        assert seg.SOPClassUID == "1.2.840.10008.5.1.4.1.1.66.4"
        assert (seg.StudyInstanceUID, seg.PatientID) == (sources[0].StudyInstanceUID, sources[0].PatientID)
        assert (row["study_instance_uid"], row["sop_instance_uid"]) == (seg.StudyInstanceUID,
                                                                         seg.SOPInstanceUID)
        assert seg.FrameOfReferenceUID == sources[0].FrameOfReferenceUID
        referenced = {i.ReferencedSOPInstanceUID for s in seg.ReferencedSeriesSequence
                      for i in s.ReferencedInstanceSequence}
        assert referenced == {ds.SOPInstanceUID for ds in sources}
        frames = seg.get_pixels_by_source_instance([ds.SOPInstanceUID for ds in sources],
                                                   segment_numbers=[1])[..., 0]
        np.testing.assert_array_equal(frames, mask)
        assert int(frames.sum()) == int(findings[row["id"]]["voxels"])
        segment = seg.SegmentSequence[0]
        algorithm = segment.SegmentationAlgorithmIdentificationSequence[0]
        assert (algorithm.AlgorithmName, algorithm.AlgorithmVersion) == ("fedmed-pe-seg-best", "3")
        assert algorithm.AlgorithmFamilyCodeSequence[0].CodeValue == "123110"  # Artificial Intelligence
        assert segment.SegmentedPropertyTypeCodeSequence[0].CodeValue == codes.SCT.PulmonaryEmbolism.value
        assert segment.SegmentAlgorithmType == "AUTOMATIC"
        assert str(seg.ContentCreatorName) == "fedmed-pe-seg-best^version 3"
        assert not [line for line in _verify(out / row["file"]) if line.startswith("Warning")]


def _check_report(path: Path, row: dict[str, str], source: Path) -> None:
    """The SR at ``path`` holds ``row``'s probability and predicted label, over ``source``."""
    sr = hd.sr.srread(path)
    sources = read_source_instances(source)
    assert sr.SOPClassUID == "1.2.840.10008.5.1.4.1.1.88.34"  # Comprehensive 3D SR
    assert (sr.StudyInstanceUID, sr.PatientID) == (sources[0].StudyInstanceUID, sources[0].PatientID)
    evidence = {i.ReferencedSOPInstanceUID for e in sr.CurrentRequestedProcedureEvidenceSequence
                for s in e.ReferencedSeriesSequence for i in s.ReferencedSOPSequence}
    assert evidence == {ds.SOPInstanceUID for ds in sources}
    report = hd.sr.MeasurementReport.from_sequence([sr])
    (group,) = report.get_image_measurement_groups()
    (measurement,) = group.get_measurements()
    (evaluation,) = group.get_qualitative_evaluations()
    assert measurement.name.value == "probability-0" and measurement.unit.value == "1"
    assert float(measurement.value) == pytest.approx(float(row["probability"]), rel=1e-5)
    present = {codes.SCT.Present.value: "1", codes.SCT.Absent.value: "0"}
    assert evaluation.name.value == "label-0" and present[evaluation.value.value] == row["predicted"]
    texts = _texts(group[0])  # TID 4019 Algorithm Identification within the group
    assert ("Algorithm Name", "fedmed-test-best") in texts and ("Algorithm Version", "7") in texts
    assert ("Device Observer Name", "fedmed-test-best") in _texts(pydicom.dcmread(path))


def _texts(item: pydicom.Dataset) -> set[tuple[str, str]]:
    """Every TEXT / UIDREF content item under ``item``: (concept meaning, value)."""
    found: set[tuple[str, str]] = set()
    for child in item.get("ContentSequence", []):
        if "TextValue" in child:
            found.add((child.ConceptNameCodeSequence[0].CodeMeaning, str(child.TextValue)))
        found |= _texts(child)
    return found


def test_the_cxr_sr_holds_the_csv_probability_and_label_and_a_png_gets_a_reason(tmp_path: Path) -> None:
    site = small_cxr_site(tmp_path / "cxr", 6, seed=1, num_test=2)
    logged = LoggedModel(_MeanLogit().eval(), "cxr-cls", TaskSettings(image_size=32), False,
                         "models:/fedmed-test-best/7")
    out = tmp_path / "out"
    predict(logged, site, out, compute=CPU)
    table = {r["id"]: r for r in _rows(out / "predictions.csv")}
    index = _rows(out / "dicom.csv")
    assert [r["id"] for r in index] == list(table)
    dicom = [r for r in index if table[r["id"]]["image"].endswith(".dcm")]
    png = [r for r in index if table[r["id"]]["image"].endswith(".png")]
    assert dicom and png
    for row in dicom:
        assert row["kind"] == "SR" and row["reason"] == ""
        _check_report(out / row["file"], table[row["id"]], site / table[row["id"]]["image"])
        _verify(out / row["file"])
    for row in png:
        assert row["file"] == "" and "\n" not in row["reason"]
        assert row["reason"].startswith(str(site / table[row["id"]]["image"]))
        assert "not a DICOM file" in row["reason"]
    assert {r["predicted"] for r in table.values()} <= {"0", "1"}


def test_the_ct3d_sr_references_every_slice_of_its_series(tmp_path: Path) -> None:
    profile = CT3DProfile(name="ct", num_studies=4, noise_hu=10.0, positive_rate=0.5,
                          dicom_fraction=0.5, image_size=16, num_slices=(4, 5),
                          slice_spacing_mm=(20.0, 24.0))
    site = generate_ct3d_site(tmp_path / "ct", profile, seed=2, num_test=0)
    logged = LoggedModel(_MeanLogit().eval(), "ct3d-cls", CT3D_SETTINGS, False,
                         "models:/fedmed-test-best/7")
    out = tmp_path / "out"
    predict(logged, site, out, compute=CPU)
    table = {r["id"]: r for r in _rows(out / "predictions.csv")}
    written = [r for r in _rows(out / "dicom.csv") if r["file"]]
    assert written and all(not table[r["id"]]["image"].endswith(".nii.gz") for r in written)
    for row in written:
        _check_report(out / row["file"], table[row["id"]], site / table[row["id"]]["image"])
        _verify(out / row["file"])


def test_a_series_that_does_not_fit_the_mask_is_named_in_one_line(pe_site: Path, tmp_path: Path) -> None:
    series_dir = next(p.parent for p in (pe_site / "studies").rglob("*") if p.is_file()
                      and p.parent.name == "dicom")
    depth, rows, columns = read_dicom_series(series_dir).shape
    wrong = np.zeros((depth + 1, rows, columns), np.uint8)
    with pytest.raises(DicomResultError) as caught:
        SegmentationContent(wrong, series_dir).dataset(IDENTITY)
    message = str(caught.value)
    assert message.startswith(str(series_dir)) and "\n" not in message
    assert f"{depth} slice(s) of {rows} x {columns}" in message and f"mask is {depth + 1} x" in message
    results = DicomResults(tmp_path, IDENTITY)
    note = results.write(PredictionItem("study-x", series_dir), SegmentationContent(wrong, series_dir))
    assert note.startswith(f"no SEG: {series_dir}") and results.finish() is not None
    assert _rows(tmp_path / "dicom.csv")[0]["reason"] == message
    assert not (tmp_path / "dicom").exists()


def test_a_source_that_is_not_dicom_gets_no_seg_naming_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "slice-1.png").write_bytes(b"\x89PNG\r\n\x1a\n not dicom")
    mask = np.zeros((1, 4, 4), np.uint8)
    with pytest.raises(DicomResultError, match=r"slice-1\.png: not a DICOM file"):
        SegmentationContent(mask, folder).dataset(IDENTITY)
    nifti = tmp_path / "ct.nii.gz"
    nifti.write_bytes(b"\x1f\x8b not dicom")
    with pytest.raises(DicomResultError, match=r"ct\.nii\.gz: not a DICOM file"):
        EvaluationContent((0.4,), nifti).dataset(IDENTITY)


def test_the_model_identity_comes_from_the_mlflow_source() -> None:
    model = nn.Identity()

    def logged(uri: str, run: str = "") -> LoggedModel:
        return LoggedModel(model, "pe-seg", PE_SETTINGS, False, uri, run)

    assert model_identity(logged("models:/fedmed-pe-seg-best/4"), "0.1.0") == ModelIdentity(
        "fedmed-pe-seg-best", "4", "0.1.0")
    assert model_identity(logged("runs:/abc123/best-model", "abc123"), "0.1.0") == ModelIdentity(
        "best-model", "run abc123", "0.1.0")
    assert model_identity(logged("/models/pe-seg-copy", "abc123"), "0.1.0").name == "pe-seg-copy"
    assert model_identity(logged("/models/pe-seg-copy"), "0.1.0").version == "unversioned"
