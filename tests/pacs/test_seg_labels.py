"""Labels from DICOM-SEG in the PACS (``[labels] source = "seg"``): the product's own SEG writer
over the synthetic hospital's masks, uploaded to a real Orthanc, synced back to the same masks;
a SEG of another series, no SEG, several segments: each one line naming the study."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import highdicom as hd
import numpy as np
import pydicom
import pytest
from pydicom.sr.codedict import codes
from pydicom.uid import generate_uid

from app.site_runtime.audit_log import AuditLog
from app.site_runtime.pacs_sync import sync_site
from app.site_runtime.site_audit import SiteAudit
from clients.io.dicom_series import read_dicom_series
from clients.io.nifti import read_nifti_mask
from clients.pacs.cohort import load_cohort
from clients.pacs.errors import CohortError
from clients.pacs.sync import store_dir, sync_cohort
from clients.pe_seg.manifest import read_manifest
from clients.prediction.dicom_seg import PULMONARY_EMBOLISM, SegmentTerms, segmentation
from clients.prediction.dicom_source import ModelIdentity, read_source_instances
from clients.site.policy import load_policy
from tests.pacs.conftest import Hospital

IDENTITY = ModelIdentity("fedmed-test-annotator", "1", "0.1.0")
LUNG = SegmentTerms("Lung", PULMONARY_EMBOLISM.category, codes.SCT.Lung)


def seg_cohort(hospital: Hospital, transport: str = "dicomweb", name: str = "seg",
               labels: str = "") -> Path:
    """A cohort file with ``source = "seg"`` and a split CSV (the labels.csv less its masks)."""
    with open(hospital.out_dir / "labels.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    split = hospital.out_dir / "split.csv"
    with open(split, "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([[uid, part, study] for uid, part, _, study in rows])
    path = hospital.cohort_file(transport, name=name)
    path.write_text(path.read_text().replace(
        '[labels]\ncsv = "labels.csv"\n', f'[labels]\nsource = "seg"\ncsv = "split.csv"\n{labels}'),
        encoding="utf-8")
    return path


def study_masks(hospital: Hospital) -> list[tuple[str, Path, np.ndarray]]:
    """Each study of the site: its study id, its series folder and its mask (z, y, x)."""
    return [(row.study_id, row.image_dir,
             read_nifti_mask(row.mask_path, reference=read_dicom_series(row.image_dir)))
            for row in read_manifest(hospital.site_dir)]


def upload(hospital: Hospital, seg: pydicom.Dataset, path: Path) -> None:
    seg.save_as(path, enforce_file_format=True)
    hospital.orthanc.upload([path])


def two_segments(mask: np.ndarray, folder: Path) -> hd.seg.Segmentation:
    """A SEG of two segments (the PE mask, and its complement as 'Lung') over the series."""
    described = []
    for number, terms in enumerate((PULMONARY_EMBOLISM, LUNG), start=1):
        described.append(hd.seg.SegmentDescription(
            segment_number=number, segment_label=terms.label,
            segmented_property_category=terms.category, segmented_property_type=terms.property_type,
            algorithm_type=hd.seg.SegmentAlgorithmTypeValues.MANUAL))
    pixels = np.stack([mask > 0, mask == 0], axis=-1).astype(np.uint8)
    return hd.seg.Segmentation(
        source_images=read_source_instances(folder), pixel_array=pixels,
        segmentation_type=hd.seg.SegmentationTypeValues.BINARY, segment_descriptions=described,
        series_instance_uid=hd.UID(), series_number=902, sop_instance_uid=hd.UID(),
        instance_number=1, manufacturer="test", manufacturer_model_name="test",
        software_versions="1", device_serial_number="1", omit_empty_frames=False)


@pytest.mark.parametrize("transport", ["dicomweb", "dimse"])
def test_seg_labels_sync_to_the_synthetic_masks_exactly(own_hospital, tmp_path, transport):
    for number, (_, folder, mask) in enumerate(study_masks(own_hospital)):
        seg = segmentation(mask, read_source_instances(folder), PULMONARY_EMBOLISM, IDENTITY, folder)
        upload(own_hospital, seg, tmp_path / f"{number}.seg.dcm")
    cohort = load_cohort(seg_cohort(own_hospital, transport, name=f"seg-{transport}"))
    assert (cohort.labels.source, cohort.labels.segment) == ("seg", "")
    report = sync_cohort(cohort, tmp_path / "state")
    assert (report.synced, report.skipped) == (3, {})
    synced = {row.study_id: row for row in read_manifest(store_dir(cohort, tmp_path / "state"))}
    expected = {row.study_id: row.split for row in read_manifest(own_hospital.site_dir)}
    assert {study: row.split for study, row in synced.items()} == expected
    for study, _, mask in study_masks(own_hospital):
        row = synced[study]
        got = read_nifti_mask(row.mask_path, reference=read_dicom_series(row.image_dir))
        assert got.dtype == mask.dtype and mask.sum() > 0
        np.testing.assert_array_equal(got, mask)
    again = sync_cohort(cohort, tmp_path / "state")  # incremental: nothing asked for again
    assert (again.synced, again.fetched_studies, again.fetched_instances) == (3, 0, 0)


def test_a_bad_seg_skips_its_study_with_one_line(own_hospital, tmp_path):
    (other, folder_a, mask_a), (missing, _, _), (several, folder_c, mask_c) = study_masks(own_hospital)
    elsewhere = [pydicom.dcmread(path) for path in sorted(folder_a.iterdir())]
    foreign = generate_uid()
    for ds in elsewhere:  # the same images as another series: its SEG references that series
        ds.SeriesInstanceUID, ds.SOPInstanceUID = foreign, generate_uid()
    ordered = read_source_instances(folder_a)
    by_position = {tuple(ds.ImagePositionPatient): ds for ds in elsewhere}
    elsewhere = [by_position[tuple(ds.ImagePositionPatient)] for ds in ordered]
    upload(own_hospital, segmentation(mask_a, elsewhere, PULMONARY_EMBOLISM, IDENTITY, folder_a),
           tmp_path / "a.seg.dcm")
    upload(own_hospital, two_segments(mask_c, folder_c), tmp_path / "c.seg.dcm")
    cohort_file = seg_cohort(own_hospital)
    cohort = load_cohort(cohort_file)
    keys = {row.study_id: key for key, row in cohort.labels.rows.items()}
    state = tmp_path / "state"
    rules = tmp_path / "policy.toml"
    rules.write_text(f'[pacs]\nendpoints = ["{own_hospital.orthanc.dicomweb_url}"]\n')
    report = sync_site(cohort_file, state, load_policy(rules), SiteAudit(state, "hospital-a"))
    assert report.synced == 0 and set(report.skipped) == set(keys.values())
    assert all("\n" not in line and line.startswith(f"study {key}: ")
               for key, line in report.skipped.items())
    chosen = str(ordered[0].SeriesInstanceUID)
    assert report.skipped[keys[other]] == (f"study {keys[other]}: the SEG references series "
                                           f"{foreign}, not the chosen CT series {chosen}")
    assert re.fullmatch(rf"study {keys[missing]}: missing label \(no SEG series in the study[^)]*\)",
                        report.skipped[keys[missing]])
    (record,) = [r for r in AuditLog(state).records() if r["kind"] == "pacs-sync"]
    assert record["skipped"] == 3  # counted; the reasons (and their UIDs) stay in the report
    assert not [uid for uid in (foreign, chosen, *keys.values()) if uid in json.dumps(record)]
    assert report.skipped[keys[several]] == (
        f"study {keys[several]}: the SEG holds 2 segments (Pulmonary embolism, Lung) and "
        "labels.segment names none; set labels.segment to the segment's label")
    named = load_cohort(seg_cohort(own_hospital, name="named",
                                   labels='segment = "Pulmonary embolism"\n'))
    report = sync_cohort(named, tmp_path / "state")
    assert report.synced == 1 and keys[several] not in report.skipped
    (row,) = read_manifest(store_dir(named, tmp_path / "state"))
    np.testing.assert_array_equal(
        read_nifti_mask(row.mask_path, reference=read_dicom_series(row.image_dir)), mask_c)


def test_seg_label_keys_are_checked(hospital, tmp_path):
    path = hospital.cohort_file(name="seg-keys")
    text = path.read_text()
    path.write_text(text.replace('[labels]\n', '[labels]\nsource = "seg"\n'))
    with pytest.raises(CohortError, match=r"labels.csv, line 1: header must be "
                                          r"'study_instance_uid,split\[,study_id\]'"):
        load_cohort(path)
    path.write_text(text.replace('[labels]\n', '[labels]\nsegment = "Lung"\n'))
    with pytest.raises(CohortError, match=r"key 'labels.segment' goes only with source = 'seg'"):
        load_cohort(path)
    path.write_text(text.replace('[labels]\n', '[labels]\nsource = "xml"\n'))
    with pytest.raises(CohortError, match=r"key 'labels.source' must be one of csv, seg"):
        load_cohort(path)
