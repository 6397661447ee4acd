"""Tests for clients.pe_seg.manifest."""

from __future__ import annotations

import pytest

from clients.errors import ManifestError, StudyError
from clients.pe_seg.manifest import ManifestRow, read_manifest, write_manifest
from strategies.errors import SiteError


def test_round_trip_relative_paths(tmp_path) -> None:
    site = tmp_path / "site"
    entries = [
        ManifestRow("a", "train", site / "studies" / "a" / "dicom", site / "studies" / "a" / "m.nii.gz"),
        ManifestRow("b", "val", site / "b", site / "b.nii.gz"),
    ]
    path = write_manifest(site, entries)
    assert path.read_text().splitlines() == [
        "study_id,split,image,mask",
        "a,train,studies/a/dicom,studies/a/m.nii.gz",
        "b,val,b,b.nii.gz",
    ]
    back = read_manifest(site)
    assert [(e.study_id, e.split) for e in back] == [("a", "train"), ("b", "val")]
    assert back[0].image_dir == (site / "studies" / "a" / "dicom").resolve()
    assert all(e.image_dir.is_absolute() and e.mask_path.is_absolute() for e in back)


def test_missing_manifest(tmp_path) -> None:
    with pytest.raises(ManifestError, match="site manifest is missing") as info:
        read_manifest(tmp_path)
    assert info.value.path.name == "manifest.csv"
    assert isinstance(info.value, SiteError) and not isinstance(info.value, StudyError)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "manifest is empty"),
        ("id,split,image,mask\n", "bad header"),
        ("study_id,split,image,mask\na,holdout,x,y\n", "line 2: bad split 'holdout'"),
        ("study_id,split,image,mask\na,train,x\n", "line 2: expected 4 fields"),
        ("study_id,split,image,mask\na,train,x,y\n\na,val,x,y\n", "line 4: duplicate study_id 'a'"),
        ("study_id,split,image,mask\na,train,,y\n", "line 2: empty image"),
    ],
)
def test_malformed_manifest(tmp_path, text, message) -> None:
    (tmp_path / "manifest.csv").write_text(text)
    with pytest.raises(ManifestError, match=message):
        read_manifest(tmp_path)


def test_write_rejects_bad_split(tmp_path) -> None:
    with pytest.raises(ValueError, match="bad split"):
        write_manifest(tmp_path, [ManifestRow("a", "holdout", tmp_path, tmp_path)])
