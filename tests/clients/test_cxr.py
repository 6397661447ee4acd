"""Chest X-ray data layer: radiograph reader (real and synthetic files), images.csv loader, synthetic hospitals."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pydicom
import pytest
from PIL import Image
from pydicom.uid import JPEGBaseline8Bit

from clients.io.radiograph import RadiographError, read_radiograph
from clients.cxr_cls.data import load_site
from clients.cxr_cls.manifest import (
    MANIFEST_NAME,
    LabelError,
    parse_labels,
    read_manifest,
)
from clients.errors import StudyError
from clients.cxr_cls.phantom import synthesize_radiograph
from clients.cxr_cls.synthetic import SiteProfile, generate_site, main, site_profiles
from clients.io.radiograph_writer import FILE_KINDS, write_radiograph
from tests.clients.manifest_cases import manifest_error

#: ../shared/data/cxr2d/samples relative to the project root (optional real data).
SAMPLES = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "cxr2d" / "samples"
NIH_PNGS = ("nih_cxr14_00000001_000.png", "nih_cxr14_00027426_000.png")
JPEG_DICOM = "siim_cxr_jpeg_baseline.dcm"
MONO1_DICOM = "cr_chest_monochrome1_16bit.dcm"

SMALL = SiteProfile(name="test-hospital", num_images=12, positive_rate=0.4, gamma=1.0, lung_contrast=1.0,
                    blur_px=0.5, noise=0.02, kind_weights=(1.0, 1.0, 1.0, 1.0, 1.0))
SIZE = 64


def sample(name: str) -> Path:
    path = SAMPLES / name
    if not path.is_file():
        pytest.skip(f"real data not found at {path} (../shared/data is optional)")
    return path


def minmax(image: np.ndarray) -> np.ndarray:
    image = image.astype(np.float64)
    return (image - image.min()) / (image.max() - image.min())


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic hospital (12 images, every file kind); read-only, copy before corrupting."""
    return generate_site(tmp_path_factory.mktemp("cxr") / "hospital", SMALL, seed=3, image_size=SIZE)


@pytest.fixture
def site_copy(site: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(site, tmp_path / "hospital"))


def set_rows(site_dir: Path, rows: list[str]) -> None:
    (site_dir / MANIFEST_NAME).write_text("image_id,split,image,labels\n" + "".join(r + "\n" for r in rows))


# --------------------------------------------------------------------------- real files


@pytest.mark.parametrize("name", NIH_PNGS)
def test_real_nih_png_reads_exactly_at_native_size_and_resized(name):
    path = sample(name)
    raw = np.asarray(Image.open(path))
    assert raw.shape == (512, 512) and raw.dtype == np.uint8
    native = read_radiograph(path, size=512)
    np.testing.assert_allclose(native, minmax(raw), atol=1e-6)
    small = read_radiograph(path, size=224)
    assert small.shape == (224, 224) and small.dtype == np.float32
    assert 0.0 <= small.min() and small.max() <= 1.0 and small.max() > 0.9
    assert abs(float(small.mean()) - float(native.mean())) < 0.01  # antialiased resize keeps the mean


def test_real_jpeg_baseline_dicom_is_decoded():
    path = sample(JPEG_DICOM)
    ds = pydicom.dcmread(path)
    assert ds.file_meta.TransferSyntaxUID == JPEGBaseline8Bit and (ds.Rows, ds.Columns) == (1024, 1024)
    native = read_radiograph(path, size=1024)
    np.testing.assert_allclose(native, minmax(ds.pixel_array), atol=1e-6)
    image = read_radiograph(path, size=224)
    assert image.shape == (224, 224) and image.dtype == np.float32
    assert 0.0 <= image.min() and image.max() <= 1.0 and image.std() > 0.15


def lungs_minus_mediastinum(image: np.ndarray) -> float:
    """Mean of the lateral lung fields minus the mean of the central column (mediastinum, spine)."""
    n = image.shape[0]
    rows = slice(int(0.25 * n), int(0.55 * n))
    lungs = np.concatenate(
        [image[rows, int(0.2 * n) : int(0.35 * n)].ravel(), image[rows, int(0.65 * n) : int(0.8 * n)].ravel()]
    )
    centre = image[int(0.25 * n) : int(0.6 * n), int(0.45 * n) : int(0.55 * n)]
    return float(lungs.mean() - centre.mean())


def test_real_monochrome1_16bit_is_inverted_and_padded():
    path = sample(MONO1_DICOM)
    ds = pydicom.dcmread(path, stop_before_pixels=True)
    assert ds.PhotometricInterpretation == "MONOCHROME1" and ds.BitsAllocated == 16
    assert (ds.Rows, ds.Columns) == (1955, 1841)
    image = read_radiograph(path, size=128)
    assert image.shape == (128, 128) and image.dtype == np.float32
    assert 0.0 <= image.min() and image.max() <= 1.0
    # After the MONOCHROME1 flip the aerated lungs are darker than mediastinum and spine
    # (on the real PNG and JPEG samples this difference is -0.15 to -0.5; unflipped it would be > 0).
    assert lungs_minus_mediastinum(image) < -0.15
    # Aspect ratio kept: 1841/1955 * 128 = 121 columns, centred, 3 + 4 padded columns of zeros.
    assert np.all(image[:, :3] == 0) and np.all(image[:, -4:] == 0)
    assert image[:, 3].max() > 0 and image[:, -5].max() > 0


@pytest.mark.parametrize("name", NIH_PNGS + (JPEG_DICOM,))
def test_real_monochrome2_samples_have_dark_lungs(name):
    assert lungs_minus_mediastinum(read_radiograph(sample(name), size=128)) < -0.1


# --------------------------------------------------------------------------- synthetic files, every kind


@pytest.fixture(scope="module")
def positive() -> object:
    return synthesize_radiograph(np.random.default_rng(11), SIZE, SMALL, positive=True)


@pytest.mark.parametrize(("kind", "atol"), [("png8", 0.01), ("png16", 1e-3), ("dicom-mono2", 2e-3),
                                            ("dicom-mono1", 1e-3), ("dicom-jpeg", 0.2)])
def test_every_file_kind_round_trips_through_the_reader(tmp_path, positive, kind, atol):
    suffix = ".png" if kind.startswith("png") else ".dcm"
    path = write_radiograph(tmp_path / f"x{suffix}", positive.image, kind, image_id="x", uid_seed=1)
    read = read_radiograph(path, size=SIZE)
    expected = minmax(positive.image)
    np.testing.assert_allclose(read, expected, atol=atol)
    assert np.abs(read - expected).mean() < 0.02


def test_file_kinds_are_what_they_claim(tmp_path, positive):
    image = positive.image
    png16 = write_radiograph(tmp_path / "a.png", image, "png16", image_id="a", uid_seed=1)
    assert Image.open(png16).mode.startswith("I;16")
    mono1 = pydicom.dcmread(write_radiograph(tmp_path / "b.dcm", image, "dicom-mono1", image_id="b", uid_seed=2))
    assert mono1.PhotometricInterpretation == "MONOCHROME1" and mono1.BitsStored == 16
    assert np.corrcoef(mono1.pixel_array.ravel(), image.ravel())[0, 1] < -0.99  # stored inverted
    mono2 = pydicom.dcmread(write_radiograph(tmp_path / "c.dcm", image, "dicom-mono2", image_id="c", uid_seed=3))
    assert (mono2.BitsStored, float(mono2.RescaleSlope)) == (12, 2.0) and mono2.pixel_array.max() < 4096
    jpeg = pydicom.dcmread(write_radiograph(tmp_path / "d.dcm", image, "dicom-jpeg", image_id="d", uid_seed=4))
    assert jpeg.file_meta.TransferSyntaxUID == JPEGBaseline8Bit


def test_rgb_png_becomes_grey_and_non_square_is_padded(tmp_path):
    ramp = np.tile(np.linspace(0, 255, 80).astype(np.uint8), (40, 1))  # 40 rows x 80 columns
    Image.fromarray(np.stack([ramp] * 3, axis=-1)).save(tmp_path / "rgb.png")
    image = read_radiograph(tmp_path / "rgb.png", size=32)
    assert image.shape == (32, 32)
    assert np.all(image[:8] == 0) and np.all(image[24:] == 0)  # 16 content rows, centred
    assert np.all(np.diff(image[16]) >= 0) and image[16, 0] < 0.05 and image[16, -1] > 0.95


# --------------------------------------------------------------------------- reader errors


def write_dicom(path: Path, **changes) -> Path:
    """A valid 16x16 MONOCHROME2 DICOM, optionally modified."""
    image = np.tile(np.linspace(0, 1, 16), (16, 1))
    write_radiograph(path, image, "dicom-mono2", image_id="bad", uid_seed=5)
    ds = pydicom.dcmread(path)
    for key, value in changes.items():
        if value is None:
            delattr(ds, key)
        else:
            setattr(ds, key, value)
    ds.save_as(path)
    return path


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda p: p.with_suffix(".png"), "file not found"),
        (lambda p: (p.with_suffix(".png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40), p.with_suffix(".png"))[1],
         "not a readable image"),
        (lambda p: (p.with_suffix(".dcm").write_bytes(b"not a dicom file at all" * 3), p.with_suffix(".dcm"))[1],
         "DICOM"),
        (lambda p: write_dicom(p.with_suffix(".dcm"), PixelData=None), "no pixel data"),
        (lambda p: write_dicom(p.with_suffix(".dcm"), NumberOfFrames=3), "multi-frame"),
        (lambda p: write_dicom(p.with_suffix(".dcm"), PhotometricInterpretation="RGB", SamplesPerPixel=3),
         "colour model"),
        (lambda p: write_dicom(p.with_suffix(".dcm"), PixelData=b"\x00\x01" * 10), "cannot decode the pixel data"),
        (lambda p: (Image.fromarray(np.zeros((4, 4), np.uint8) + 9).save(p.with_suffix(".png")),
                    p.with_suffix(".png"))[1], "smaller than"),
        (lambda p: (Image.fromarray(np.full((20, 20), 7, np.uint8)).save(p.with_suffix(".png")),
                    p.with_suffix(".png"))[1], "constant image"),
    ],
    ids=["missing", "corrupt-png", "garbage-dcm", "no-pixels", "multi-frame", "rgb-dicom", "truncated-pixels",
         "tiny", "constant"],
)
def test_bad_files_raise_radiograph_error_naming_file_and_reason(tmp_path, make, reason):
    path = make(tmp_path / "bad")
    with pytest.raises(RadiographError) as info:
        read_radiograph(path, size=32)
    assert isinstance(info.value, StudyError)
    assert str(path) in str(info.value) and reason in info.value.reason


def test_truncated_png_is_an_error(tmp_path, positive):
    path = write_radiograph(tmp_path / "t.png", positive.image, "png8", image_id="t", uid_seed=1)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(RadiographError, match="not a readable image"):
        read_radiograph(path, size=32)


# --------------------------------------------------------------------------- images.csv and the loader


def test_loader_returns_images_and_labels_per_split(site):
    entries = read_manifest(site)
    items, report = load_site(site, "train", SIZE, 1)
    assert report.num_skipped == 0 and report.num_loaded == len(items) == sum(e.split == "train" for e in entries)
    image_id, image, labels = items[0]
    assert image.shape == (SIZE, SIZE) and image.dtype == np.float32 and 0 <= image.min() and image.max() <= 1
    assert labels.shape == (1,) and labels.dtype == np.float32
    val, _ = load_site(site, "val", SIZE, 1)
    assert {i.image_id for i in val}.isdisjoint(report.loaded)
    assert {float(i.labels[0]) for i in val} == {0.0, 1.0}  # stratified: both classes in val


def test_bad_items_are_skipped_counted_and_logged_once_each(site_copy, caplog):
    images = site_copy / "images"
    good = sorted(images.iterdir())
    (images / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    set_rows(
        site_copy,
        [
            f"ok-0,train,images/{good[0].name},1",
            f"ok-1,train,images/{good[1].name},0",
            "corrupt,train,images/corrupt.png,1",
            "absent,train,images/absent.dcm,0",
            f"no-label,train,images/{good[2].name},",
            f"label-2,train,images/{good[3].name},2",
            f"label-minus1,train,images/{good[4].name},-1",
            f"too-many,train,images/{good[5].name},0;1",
            f"not-a-number,train,images/{good[6].name},yes",
        ],
    )
    with caplog.at_level(logging.WARNING, logger="clients.cxr_cls.manifest"):
        items, report = load_site(site_copy, "train", 32, 1)
    assert [i.image_id for i in items] == report.loaded == ["ok-0", "ok-1"]
    assert [float(i.labels[0]) for i in items] == [1.0, 0.0]
    bad = ["corrupt", "absent", "no-label", "label-2", "label-minus1", "too-many", "not-a-number"]
    assert list(report.skipped) == bad and report.num_skipped == 7
    reasons = report.skipped
    assert "corrupt.png" in reasons["corrupt"] and "not a readable image" in reasons["corrupt"]
    assert "absent.dcm" in reasons["absent"] and "file not found" in reasons["absent"]
    assert "missing labels" in reasons["no-label"] and "line 6" in reasons["no-label"]
    assert "outside the classes" in reasons["label-2"] and "outside the classes" in reasons["label-minus1"]
    assert "2 value(s); the task has 1 class(es)" in reasons["too-many"]
    assert "not a number" in reasons["not-a-number"]
    for image_id in bad[2:]:
        assert MANIFEST_NAME in reasons[image_id] and f"(image {image_id})" in reasons[image_id]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 7
    assert all(line.startswith(f"Skipping image {i}: ") for line, i in zip(lines, bad))


def test_multi_label_rows(site_copy):
    name = sorted((site_copy / "images").iterdir())[0].name
    set_rows(site_copy, [f"a,val,images/{name},0;1;1", f"b,val,images/{name}, 1 ; 0 ; 0 ", f"c,val,images/{name},1;1"])
    items, report = load_site(site_copy, "val", 32, 3)
    assert [i.labels.tolist() for i in items] == [[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]
    assert list(report.skipped) == ["c"] and "the task has 3 class(es)" in report.skipped["c"]


def test_parse_labels_errors_are_label_errors():
    with pytest.raises(LabelError, match="label 1 is missing"):
        parse_labels("0;;1", 3, Path("images.csv"))
    np.testing.assert_array_equal(parse_labels("1.0;0", 2, Path("images.csv")), [1.0, 0.0])


def test_empty_site_loads_nothing(site_copy, caplog):
    set_rows(site_copy, [])
    with caplog.at_level(logging.WARNING, logger="clients.cxr_cls.manifest"):
        items, report = load_site(site_copy, None, 32, 1)
    assert items == [] and report.num_loaded == report.num_skipped == 0
    assert "No images" in caplog.text


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (None, "site manifest is missing"),
        ("", "manifest is empty"),
        ("image_id,split,image\n", "bad header"),
        ("image_id,split,image,labels\na,train,images/x.png\n", "line 2: expected 4 fields, got 3"),
        ("image_id,split,image,labels\na,holdout,images/x.png,1\n", "bad split"),
        ("image_id,split,image,labels\na,train,,1\n", "empty image"),
        ("image_id,split,image,labels\na,train,x.png,1\na,val,y.png,0\n", "line 3: duplicate image_id"),
    ],
)
def test_malformed_manifest_raises_manifest_error(tmp_path, text, reason):
    error = manifest_error(tmp_path, MANIFEST_NAME, text, lambda site: load_site(site, None, 32, 1))
    assert reason in error.reason and MANIFEST_NAME in str(error)


# --------------------------------------------------------------------------- synthetic hospitals


def test_same_seed_writes_identical_files_other_seed_differs(site, tmp_path):
    again = generate_site(tmp_path / "again", SMALL, seed=3, image_size=SIZE)
    other = generate_site(tmp_path / "other", SMALL, seed=4, image_size=SIZE)
    files = sorted(p.relative_to(site) for p in site.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    assert all((site / f).read_bytes() == (again / f).read_bytes() for f in files)
    assert any((site / f).read_bytes() != (other / f).read_bytes() for f in files if (other / f).is_file())


def file_kind(path: Path) -> str:
    if path.suffix == ".png":
        return "png16" if Image.open(path).mode.startswith("I;16") else "png8"
    ds = pydicom.dcmread(path, stop_before_pixels=True)
    if ds.file_meta.TransferSyntaxUID == JPEGBaseline8Bit:
        return "dicom-jpeg"
    return "dicom-mono1" if ds.PhotometricInterpretation == "MONOCHROME1" else "dicom-mono2"


def test_every_hospital_writes_every_file_kind_and_both_classes(site):
    entries = read_manifest(site)
    assert len(entries) == SMALL.num_images + 4  # + 4 held-out test images, 2 positive
    assert {file_kind(e.image_path) for e in entries} == set(FILE_KINDS)
    assert sum(e.labels == "1" for e in entries) == round(SMALL.positive_rate * SMALL.num_images) + 2
    assert (site / "SYNTHETIC.txt").is_file()


def test_hospital_profiles_differ():
    profiles = site_profiles(3, seed=0)
    assert [p.name for p in profiles] == ["hospital-00", "hospital-01", "hospital-02"]
    for field in ("num_images", "positive_rate", "gamma", "noise", "lung_contrast", "blur_px"):
        assert len({getattr(p, field) for p in profiles}) == 3, field
    assert all(40 <= p.num_images <= 80 and 0.25 <= p.positive_rate <= 0.5 for p in profiles)
    assert profiles == site_profiles(3, seed=0)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_pneumothorax_is_dark_and_bounded_by_a_pleural_line_in_the_file(tmp_path, seed):
    """Measured on the written file as read back (noise, blur and all)."""
    drawn = synthesize_radiograph(np.random.default_rng(seed), 96, SMALL, positive=True)
    image = read_radiograph(write_radiograph(tmp_path / "p.png", drawn.image, "png16", image_id="p", uid_seed=0), 96)
    ptx, lung, line = drawn.pneumothorax > 0.99, drawn.aerated_lung > 0.99, drawn.pleural_line > 0.5
    assert ptx.sum() > 100 and line.sum() > 20
    assert image[ptx].mean() < image[lung].mean() - 0.05  # darker: air without lung tissue or vessels
    assert image[line].mean() > image[ptx].mean() + 0.05  # thin bright visceral pleural line


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_pneumothorax_removes_the_vessel_markings(seed):
    """Same random stream with and without a pneumothorax: the same patient, anatomy and noise.

    In the pneumothorax region the positive image has lost exactly the vessel
    markings that its negative twin shows there.
    """
    pos = synthesize_radiograph(np.random.default_rng(seed), 96, SMALL, positive=True)
    neg = synthesize_radiograph(np.random.default_rng(seed), 96, SMALL, positive=False)
    assert neg.pneumothorax.max() == 0 and neg.pleural_line.max() == 0
    far = (pos.pneumothorax == 0) & (pos.pleural_line < 1e-3)
    assert np.abs(pos.image - neg.image)[far].mean() < 0.002  # twins: identical away from the pneumothorax
    ptx = pos.pneumothorax > 0.99
    assert pos.markings[ptx].max() < 1e-3 and neg.markings[ptx].mean() > 0.02
    lost = (neg.image - pos.image)[ptx]
    assert lost.mean() > 0.03
    assert np.corrcoef(lost, neg.markings[ptx])[0, 1] > 0.5


def test_cli_prints_progress(tmp_path, capsys):
    assert main(["--out", str(tmp_path / "fed"), "--sites", "1", "--seed", "5", "--image-size", "32"]) == 0
    out = capsys.readouterr().out
    assert "[1/1] hospital-00:" in out and "pneumothorax" in out and "Done: 1 hospitals" in out
    assert len(read_manifest(tmp_path / "fed" / "hospital-00")) >= 40
