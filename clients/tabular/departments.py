"""Cleveland's 303 patients split vertically into a hospital's departments (a vertical federation).

Each department is a site folder holding its own variables of the same
patients, with its own task from its own variables, as in pvFed's tabular
protocol (Nishikawa et al., IEEJ 2024: every institution keeps its own model
and its own task)::

    <out>/hospital-00/  clinic      age, sex, trestbps, chol, fbs     task: asymptomatic chest pain (cp == 4)
    <out>/hospital-01/  stress-lab  restecg, thalach, oldpeak, slope  task: exercise-induced angina (exang)
    <out>/hospital-02/  cath-lab    ca, thal                          task: coronary disease (num > 0, the set's y)

(folders named as the simulation's sites, ``hospital-<partition>``; the department is
named in the folder's ``vertical-site.toml``)

Why these targets: the clinic's history records the chest-pain type, which it
predicts from the patient's profile and risk factors; the stress-test lab sees
whether exercise brings on angina; the nuclear medicine / catheter lab, which
colours the vessels and scans with thallium, is the one that diagnoses
coronary disease. Each task's variable is left out of every department's
inputs (``cp`` and ``exang`` are targets, not features).

Each folder holds ``table.csv`` (:mod:`clients.tabular.table`; ``patient_id`` =
the set's ``id``, e.g. ``cleveland_000``, the same in every department),
``vertical-site.toml`` (``task = "tabular-cls"``, ``department = "<name>"``)
and ``SOURCE.txt``. A patient has the **same split in every department**:
60/20/20 train/val/test, stratified on coronary disease, drawn with ``seed``.
With ``coverage < 1`` each department independently keeps that share of the
patients (so the departments' private set intersection has patients to leave
out); the default keeps all 303. A folder this writer did not create is never
written into.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clients.tabular.heart_variables import HEART_FEATURES
from clients.tabular.shared import HEART_DISEASE, read_heart_disease
from clients.datagen.vertical_sets import write_site_file
from clients.tabular.table import TableRow, format_value, write_table
from strategies.wire.errors import ConfigError
from clients.datagen.federation import hospital_name

__all__ = ["Department", "DEPARTMENTS", "patient_splits", "write_departments"]

#: The department's description of itself, read by the vertical site.
_SOURCE = "SOURCE.txt"
_MARKER_LINE = "Written by clients.tabular.departments"


@dataclass(frozen=True)
class Department:
    """A department: its name (site folder), its variables and its task's target.

    ``target`` is a variable of the set (``cp``, ``exang``) made 0/1 by ``positive`` (the
    code that counts as 1), or ``"num>0"`` for the set's coronary-disease label ``y``.
    """

    name: str
    features: tuple[str, ...]
    target: str
    positive: float
    task: str

    def labels(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """The department's 0/1 labels of rows ``x`` of the 13 variables (``y``: num > 0)."""
        if self.target == "num>0":
            return y.astype(np.int64)
        return (x[:, HEART_FEATURES.index(self.target)] == self.positive).astype(np.int64)


#: The three departments, in site order.
DEPARTMENTS: tuple[Department, ...] = (
    Department("clinic", ("age", "sex", "trestbps", "chol", "fbs"), "cp", 4.0,
               "asymptomatic chest pain (cp == 4)"),
    Department("stress-lab", ("restecg", "thalach", "oldpeak", "slope"), "exang", 1.0,
               "exercise-induced angina (exang == 1)"),
    Department("cath-lab", ("ca", "thal"), "num>0", 1.0, "coronary disease (num > 0)"),
)


def patient_splits(y: np.ndarray, seed: int) -> np.ndarray:
    """``train`` / ``val`` / ``test`` per patient: 20% of each class to val, 20% to test.

    Stratified on ``y`` (0/1) and drawn from ``SeedSequence([seed, 0xDE9])``.
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xDE9]))
    splits = np.full(y.size, "train", dtype=object)
    for value in (0, 1):
        members = rng.permutation(np.flatnonzero(y == value))
        k = int(round(0.2 * members.size))
        splits[members[:k]] = "val"
        splits[members[k:2 * k]] = "test"
    return splits


def _claim(site_dir: Path) -> None:
    """Empty a department folder written earlier by this writer; refuse any other non-empty one.

    Raises
    ------
    FileExistsError
        If ``site_dir`` is not empty and has no ``SOURCE.txt`` of this writer.
    """
    marker = site_dir / _SOURCE
    if marker.is_file() and _MARKER_LINE in marker.read_text(encoding="utf-8", errors="replace"):
        shutil.rmtree(site_dir)
    elif site_dir.exists() and (not site_dir.is_dir() or any(site_dir.iterdir())):
        raise FileExistsError(f"{site_dir} exists and was not written by clients.tabular.departments; "
                              "refusing to write into it")
    site_dir.mkdir(parents=True, exist_ok=True)


def write_departments(shared: Path, out: Path, seed: int, coverage: float = 1.0) -> list[Path]:
    """Write the three department folders of Cleveland's patients under ``out``; return them.

    Parameters
    ----------
    shared : Path
        The shared data folder (``../shared/data``).
    out : Path
        Receives ``clinic/``, ``stress-lab/`` and ``cath-lab/``.
    seed : int
        Seed of the split and of the coverage draws.
    coverage : float, optional
        Share of the patients each department keeps, in (0, 1] (drawn independently per
        department from ``SeedSequence([seed, 0xC0, k])``).

    Raises
    ------
    ConfigError
        If ``coverage`` is outside (0, 1] or ``out`` lies inside ``shared``.
    FileNotFoundError
        If the set's file is absent.
    FileExistsError
        If a department folder exists that this writer did not create.
    """
    shared, out = Path(shared), Path(out)
    if not 0.0 < coverage <= 1.0:
        raise ConfigError(f"--coverage must be in (0, 1], got {coverage}")
    if shared.exists() and out.resolve().is_relative_to(shared.resolve()):
        raise ConfigError(f"--out {out} lies inside the shared data folder {shared}; never write there")
    data = read_heart_disease(shared)
    cleveland = np.flatnonzero(data["site"] == 0)
    x, y, ids = data["X"][cleveland], data["y"][cleveland], [str(i) for i in data["id"][cleveland]]
    splits = patient_splits(y, seed)
    folders = []
    for k, department in enumerate(DEPARTMENTS):
        keep = np.arange(y.size)
        if coverage < 1.0:
            rng = np.random.default_rng(np.random.SeedSequence([seed, 0xC0, k]))
            keep = np.sort(rng.choice(y.size, size=max(1, int(round(coverage * y.size))), replace=False))
        columns = [HEART_FEATURES.index(name) for name in department.features]
        labels = department.labels(x, y)
        site_dir = out / hospital_name(k)  # simulation's partition k; its name: the site file
        _claim(site_dir)
        write_table(site_dir, department.features, (
            TableRow(ids[i], str(splits[i]), str(labels[i]),
                     tuple(format_value(v) for v in x[i, columns])) for i in keep))
        write_site_file(site_dir, "tabular-cls", department.name)
        (site_dir / _SOURCE).write_text(
            f"{_MARKER_LINE} (set=heart-disease seed={seed} coverage={coverage:g}).\n\n"
            f"Department: {department.name} of Cleveland Clinic Foundation, {keep.size} of its "
            f"{y.size} patients.\nVariables: {', '.join(department.features)}.\n"
            f"Task (label 1): {department.task}.\n"
            f"Source: ../shared/data/{HEART_DISEASE.files[0]}\n{HEART_DISEASE.license}",
            encoding="utf-8")
        folders.append(site_dir)
    return folders
