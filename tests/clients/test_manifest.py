"""Tests for clients.pe_seg.manifest."""

from __future__ import annotations

from pathlib import Path

import pytest

from clients.ct3d_cls import manifest as ct3d_manifest
from clients.cxr_cls import manifest as cxr_manifest
from clients.errors import ManifestError, StudyError
from clients.pe_seg import manifest as pe_manifest
from clients.pe_seg.manifest import ManifestRow, read_manifest, write_manifest
from strategies.wire.errors import SiteError


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


def _outside_cases(tmp_path) -> tuple[Path, list[tuple[str, str]]]:
    """A site folder and (path value, how it leaves) of each way out of it."""
    site, other = tmp_path / "site", tmp_path / "other"
    (site / "studies").mkdir(parents=True)
    other.mkdir()
    (other / "x.nii.gz").write_bytes(b"x")
    (site / "studies" / "out").symlink_to(other, target_is_directory=True)
    return site, [("../other/x.nii.gz", "parent"), (str(other / "x.nii.gz"), "absolute"),
                  ("studies/out/x.nii.gz", "symlink")]


@pytest.mark.parametrize("module", [pe_manifest, cxr_manifest, ct3d_manifest],
                         ids=["pe-seg", "cxr-cls", "ct3d-cls"])
def test_a_path_that_leaves_the_site_folder_is_refused_naming_the_line(tmp_path, module) -> None:
    site, cases = _outside_cases(tmp_path)
    header = ",".join(module.MANIFEST_COLUMNS)
    inside = {"split": "train", "image": "studies/a", "mask": "studies/a.nii.gz", "labels": "",
              "label": "1"}
    for value, how in cases:
        rows = [dict(inside, **{module.MANIFEST_COLUMNS[0]: "a"}),
                dict(inside, **{module.MANIFEST_COLUMNS[0]: "b", "image": value})]
        text = "\n".join([header] + [",".join(r[c] for c in module.MANIFEST_COLUMNS)
                                     for r in rows]) + "\n"
        (site / module.MANIFEST_NAME).write_text(text)
        with pytest.raises(ManifestError, match=r"line 3: image .* leaves the site folder") as info:
            module.read_manifest(site)
        assert info.value.path.name == module.MANIFEST_NAME, how


def test_a_site_folder_that_is_itself_a_symlink_still_reads(tmp_path) -> None:
    real = tmp_path / "real"
    write_manifest(real, [ManifestRow("a", "train", real / "studies" / "a", real / "a.nii.gz")])
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    assert [row.image_dir for row in read_manifest(link)] == [real.resolve() / "studies" / "a"]
