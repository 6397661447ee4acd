"""The synthetic multimodal cohort: three institutions' folders, each read by its own task.

What is checked: every folder loads with the task its ``vertical-site.toml`` names and
its ids are the patients it holds; a patient has one id and one split everywhere;
each site holds its own ``coverage`` share; the latent severity links the sites (the
others' simple summaries predict a site's label; the others' views add to a site's
own); the same seed writes the same files; a folder the product did not write is refused.
"""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

from clients.datagen.cohort import LABEL_THRESHOLDS, SITES, draw_cohort, write_cohort
from clients.datagen.cohort_sites import LAB_FEATURES
from clients.prediction.classifier import macro_auc
from clients.registry import task_class
from clients.training.site_task import SiteTask, TaskSettings

PATIENTS, SEED = 80, 3
SETTINGS = TaskSettings(image_size=32, volume_depth=16, batch_size=4)


@pytest.fixture(scope="module")
def cohort_sites(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_cohort(None, tmp_path_factory.mktemp("cohort"), SEED, patients=PATIENTS)


@pytest.fixture(scope="module")
def tasks(cohort_sites: list[Path]) -> dict[str, SiteTask]:
    """Each folder loaded by the task its vertical-site.toml names."""
    loaded = {}
    for k, (folder, site) in enumerate(zip(cohort_sites, SITES)):
        assert folder.name == f"hospital-{k:02d}"  # the simulation's partition k
        described = tomllib.loads((folder / "vertical-site.toml").read_text())
        assert described == {"task": SITES[site], "department": site}
        loaded[site] = task_class(described["task"])(folder, SETTINGS)
    return loaded


def _auc(scores: np.ndarray, labels: np.ndarray) -> float:
    return macro_auc(torch.tensor(scores, dtype=torch.float32)[:, None],
                     torch.tensor(labels, dtype=torch.float32)[:, None])


def _split_of(task: SiteTask) -> dict[str, str]:
    """Patient id -> split, from the task's loaded ids (in order train, val, test)."""
    sizes = [0 if data is None else len(data) for data in (task.train_set, task.val_set, task.test_set)]
    splits = [split for split, size in zip(("train", "val", "test"), sizes) for _ in range(size)]
    return dict(zip(task.report.loaded, splits))


def test_each_folder_loads_with_its_own_task_and_its_ids_are_the_patients_it_holds(tasks) -> None:
    cohort = draw_cohort(PATIENTS, SEED)
    assert list(tasks) == ["ct-centre", "xray-clinic", "lab"]
    for site, task in tasks.items():
        held = {cohort.patient_ids[i] for i in np.flatnonzero(cohort.held[site])}
        assert task.report.num_skipped == 0
        assert sorted(task.report.loaded) == sorted(held)
        labels = np.concatenate([torch.stack(data.labels).numpy()[:, 0]
                                 for data in (task.train_set, task.val_set, task.test_set)])
        expected = [cohort.labels[site][cohort.patient_ids.index(p)] for p in task.report.loaded]
        np.testing.assert_array_equal(labels, expected)


def test_a_patient_has_one_id_and_one_split_at_every_site(tasks) -> None:
    cohort = draw_cohort(PATIENTS, SEED)
    truth = dict(zip(cohort.patient_ids, cohort.splits))
    for task in tasks.values():
        assert _split_of(task) == {p: truth[p] for p in task.report.loaded}
    assert [cohort.splits.count(s) for s in ("train", "val", "test")] == [48, 16, 16]


def test_the_sites_write_their_patients_in_their_own_order(cohort_sites: list[Path]) -> None:
    orders = [[line.split(",")[0] for line in (folder / name).read_text().splitlines()[1:]]
              for folder, name in zip(cohort_sites, ("labels.csv", "images.csv", "table.csv"))]
    assert orders[0] != sorted(orders[0])
    assert len({tuple(sorted(set(orders[0]) & set(o))) for o in orders[1:]}) == 2


def test_each_site_holds_its_own_coverage_share() -> None:
    cohort = draw_cohort(200, 0, coverage=0.7)
    held = [cohort.held[site] for site in SITES]
    assert [int(mask.sum()) for mask in held] == [140, 140, 140]
    assert len({mask.tobytes() for mask in held}) == 3
    assert 60 <= int(np.logical_and.reduce(held).sum()) < 140
    assert all(mask.all() for mask in draw_cohort(200, 0, coverage=1.0).held.values())
    with pytest.raises(ValueError, match="coverage"):
        draw_cohort(200, 0, coverage=0.0)


def test_other_modalities_add_information_about_a_sites_own_label() -> None:
    cohort = draw_cohort(4000, 1)
    views = np.stack([cohort.views[site] for site in SITES], axis=1)
    for k, site in enumerate(SITES):
        own = _auc(views[:, k], cohort.labels[site])
        others = _auc(np.delete(views, k, axis=1).sum(axis=1), cohort.labels[site])
        both = _auc(views.sum(axis=1), cohort.labels[site])
        assert 0.7 < own < 0.85 and others > 0.75 and both > own + 0.05
        assert _auc(cohort.views[site] > LABEL_THRESHOLDS[site], cohort.labels[site]) < own


def _summaries(tasks: dict[str, SiteTask]) -> dict[str, dict[str, float]]:
    """Per site, patient id -> a simple summary of what its modality shows, from the loaded items."""
    def images(task: SiteTask) -> list[np.ndarray]:
        return [x.numpy()[0] for data in (task.train_set, task.val_set, task.test_set) for x in data.images]

    below_950_hu = (-950 + 1350) / 1500  # the lung window of ct3d-cls maps -1350..150 HU to 0..1
    ct = [float(np.mean(v[:, 8:24, 4:28] < below_950_hu)) for v in images(tasks["ct-centre"])]
    xray = [float(np.abs(v[14:30] - v[14:30, ::-1]).mean()) for v in images(tasks["xray-clinic"])]
    table = (Path(tasks["lab"].site_dir) / "table.csv").read_text().splitlines()
    columns = {name: table[0].split(",").index(name) for name in ("wbc", "neutrophils", "albumin")}
    cells = [line.split(",") for line in table[1:]]
    values = {name: np.array([float(c[i] or "nan") for c in cells]) for name, i in columns.items()}
    scaled = {name: (v - np.nanmean(v)) / np.nanstd(v) for name, v in values.items()}
    composite = np.nan_to_num(scaled["wbc"]) + np.nan_to_num(scaled["neutrophils"]) - np.nan_to_num(scaled["albumin"])
    lab = {c[0]: float(x) for c, x in zip(cells, composite)}
    return {"ct-centre": dict(zip(tasks["ct-centre"].report.loaded, ct)),
            "xray-clinic": dict(zip(tasks["xray-clinic"].report.loaded, xray)), "lab": lab}


def test_the_other_sites_summaries_predict_a_sites_label(tasks) -> None:
    cohort = draw_cohort(PATIENTS, SEED)
    summaries = _summaries(tasks)
    for site in SITES:
        others = [s for s in SITES if s != site]
        shared = sorted(set.intersection(*(set(summaries[s]) for s in SITES)))
        z = []
        for other in others:
            values = np.array([summaries[other][p] for p in shared])
            z.append((values - values.mean()) / values.std())
        labels = np.array([cohort.labels[site][cohort.patient_ids.index(p)] for p in shared])
        assert _auc(np.sum(z, axis=0), labels) > 0.65, site


def _digests(folders: list[Path]) -> dict[str, str]:
    return {str(path.relative_to(folder.parent)): hashlib.sha256(path.read_bytes()).hexdigest()
            for folder in folders for path in sorted(folder.rglob("*")) if path.is_file()}


def test_the_same_seed_writes_the_same_files_and_rewrites_its_own_folders(tmp_path: Path) -> None:
    first = _digests(write_cohort(None, tmp_path / "a", 5, patients=40))
    assert _digests(write_cohort(None, tmp_path / "a", 5, patients=40)) == first
    assert draw_cohort(40, 6).labels["lab"].tolist() != draw_cohort(40, 5).labels["lab"].tolist()
    assert any(name.endswith(".dcm") for name in first) and any(name.endswith(".nii.gz") for name in first)
    assert any(name.endswith(".png") for name in first) and any("/dicom/" in name for name in first)


def test_a_folder_the_product_did_not_write_is_refused(tmp_path: Path) -> None:
    (tmp_path / "hospital-02").mkdir()  # where the lab would go
    (tmp_path / "hospital-02" / "notes.txt").write_text("a hospital's file")
    with pytest.raises(FileExistsError, match="hospital-02"):
        write_cohort(None, tmp_path, 0, patients=40)
    assert (tmp_path / "hospital-02" / "notes.txt").read_text() == "a hospital's file"
    assert sorted(p.name for p in (tmp_path / "hospital-02").iterdir()) == ["notes.txt"]


def test_the_lab_table_has_missing_cells_and_every_lab_value(cohort_sites: list[Path]) -> None:
    lines = (cohort_sites[2] / "table.csv").read_text().splitlines()
    assert lines[0] == ",".join(["patient_id", "split", "label", *LAB_FEATURES, "sex"])
    assert any(",," in line or line.endswith(",") for line in lines[1:])

