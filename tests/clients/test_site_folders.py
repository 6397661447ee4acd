"""The synthetic generators write only into site folders they created (issue #12)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clients.cxr_cls.synthetic import SiteProfile, generate_site
from clients.cxr_cls.synthetic import main as cxr_main
from clients.datagen.federation import MARKER_NAME, claim_site_dir

TINY = SiteProfile(name="hospital-00", num_images=4, positive_rate=0.5, gamma=1.0, lung_contrast=1.0,
                   blur_px=0.5, noise=0.02, kind_weights=(1.0, 0.0, 0.0, 0.0, 0.0))


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _real_site(site: Path) -> Path:
    """A hospital's own site: DICOM files under dicom/ and its own images.csv, no SYNTHETIC.txt."""
    (site / "dicom").mkdir(parents=True)
    (site / "dicom" / "0001.dcm").write_bytes(b"a real radiograph")
    (site / "images.csv").write_text("image_id,split,image,labels\nr1,train,dicom/0001.dcm,1\n")
    return site


def test_generator_refuses_a_real_site_keeping_its_files_under_dicom(tmp_path) -> None:
    site = _real_site(tmp_path / "hospital-00")
    before = _snapshot(site)
    with pytest.raises(FileExistsError, match="not a synthetic hospital") as info:
        generate_site(site, TINY, seed=0, image_size=32)
    assert str(site) in str(info.value)
    assert _snapshot(site) == before  # images.csv and dicom/ untouched, no marker added


def test_generator_cli_refuses_a_folder_of_real_sites(tmp_path, capsys) -> None:
    _real_site(tmp_path / "hospitals" / "hospital-00")
    before = _snapshot(tmp_path / "hospitals")
    assert cxr_main(["--out", str(tmp_path / "hospitals"), "--sites", "1", "--image-size", "32"]) == 1
    assert f"{tmp_path / 'hospitals' / 'hospital-00'}: not a synthetic hospital" in capsys.readouterr().err
    assert _snapshot(tmp_path / "hospitals") == before


def test_generator_writes_new_empty_and_its_own_folders(tmp_path) -> None:
    new = claim_site_dir(tmp_path / "new", "images", "synthetic")
    assert (tmp_path / "new" / MARKER_NAME).is_file() and not new.exists()
    (tmp_path / "empty").mkdir()
    claim_site_dir(tmp_path / "empty", "images", "synthetic")
    first = generate_site(tmp_path / "own", TINY, seed=0, image_size=32)
    (first / "images" / "stale.png").write_bytes(b"from an earlier run")
    again = generate_site(first, TINY, seed=1, image_size=32)
    assert not (again / "images" / "stale.png").exists()  # an earlier synthetic hospital is replaced


def test_a_file_where_a_site_folder_should_be_is_refused(tmp_path) -> None:
    (tmp_path / "hospital-00").write_text("not a folder")
    with pytest.raises(FileExistsError, match="not a synthetic hospital"):
        claim_site_dir(tmp_path / "hospital-00", "images", "synthetic")


def test_generator_cli_takes_a_relative_out_folder(tmp_path, monkeypatch, capsys) -> None:
    from clients.pe_seg.synthetic import main as pe_main

    monkeypatch.chdir(tmp_path)
    assert pe_main(["--out", "data/x", "--sites", "1", "--image-size", "32"]) == 0
    series = list((tmp_path / "data" / "x" / "hospital-00" / "studies").glob("*/dicom/*"))
    assert series, capsys.readouterr()
    assert not (tmp_path / "data" / "x" / "hospital-00" / "data").exists()  # no doubled path
