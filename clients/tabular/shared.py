"""The shared real set of tabular classification, as federated sites (:mod:`clients.datagen.shared`).

``heart-disease``: ``tabular/heart_disease/heart_disease_4sites.npz``, UCI Heart
Disease from its four hospitals (the source of FLamby's Fed-Heart-Disease):
the hospitals are the sites (``hospital-00`` Cleveland, ``-01`` Hungarian,
``-02`` Switzerland, ``-03`` VA Long Beach; ``--sites`` must be 4, the
partition scheme does not apply), each with its own train / val / test split
(val stratified by label, test a seeded share of the rest:
:mod:`clients.datagen.held_out`). Each site's ``table.csv``
(:mod:`clients.tabular.table`) holds the 13 variables
(:data:`~clients.tabular.heart_variables.HEART_FEATURES`); the label is
**coronary artery disease, num > 0** (angiographic narrowing > 50%). A
cholesterol of 0 (all Swiss and 49 VA patients) is written as missing, as the
set's README says; ``ca``, ``thal`` and ``slope`` are mostly missing outside
Cleveland and stay missing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from clients.datagen.shared_set import SharedSet, SiteItems, set_registry, source_path
from clients.tabular.heart_variables import HEART_FEATURES
from clients.tabular.table import TableRow, format_value, write_table
from clients.datagen.federation import hospital_name
from strategies.wire.registry import Registry

__all__ = ["HEART_DISEASE", "SETS", "read_heart_disease"]

#: The set's file under the shared data folder.
HEART_DISEASE_FILE = "tabular/heart_disease/heart_disease_4sites.npz"


def read_heart_disease(shared: Path) -> dict[str, np.ndarray]:
    """The set's arrays: ``X`` (920, 13) float32 with NaN = missing (cholesterol 0 made missing),
    ``y`` (0/1, num > 0), ``site`` (0-3), ``id``, ``site_names``.

    Raises
    ------
    FileNotFoundError
        If the file is absent.
    ValueError
        If its columns are not the 13 standard variables in order.
    """
    path = source_path(shared, HEART_DISEASE_FILE)
    with np.load(path, allow_pickle=False) as data:
        arrays = {key: data[key] for key in ("X", "y", "site", "id", "feature_names", "site_names")}
    if tuple(str(n) for n in arrays["feature_names"]) != HEART_FEATURES:
        raise ValueError(f"{path}: feature_names {list(arrays['feature_names'])} are not "
                         f"{list(HEART_FEATURES)}")
    x = arrays["X"].astype(np.float32)
    chol = HEART_FEATURES.index("chol")
    x[x[:, chol] == 0, chol] = np.nan  # recorded as 0, not measured (the set's README)
    arrays["X"] = x
    return arrays


def _items(source: SharedSet, shared: Path, block_slices: int) -> SiteItems:
    data = read_heart_disease(shared)
    x, y, ids = data["X"], data["y"].astype(np.int64), [str(i) for i in data["id"]]

    def write(site_dir: Path, idx: np.ndarray, splits: np.ndarray) -> None:
        write_table(site_dir, HEART_FEATURES, (
            TableRow(ids[i], str(split), str(int(y[i])), tuple(format_value(v) for v in x[i]))
            for i, split in zip(idx, splits)))

    names = ", ".join(f"{hospital_name(k)} = {name}" for k, name in enumerate(data["site_names"]))
    return SiteItems(y, ids, write, hospitals=data["site"].astype(np.int64),
                     note=f"Sites: the set's own hospitals ({names}).\n")


HEART_DISEASE = SharedSet(
    "heart-disease", "tabular-cls", (HEART_DISEASE_FILE,),
    "UCI Heart Disease, 920 angiography patients (1981-1988) of 4 hospitals, 13 clinical\n"
    "variables; cholesterol 0 written as missing. Label: 1 = coronary artery disease\n"
    "(num > 0), 0 = none. Strong label shift (Switzerland 93% positive); ca/thal/slope\n"
    "mostly missing outside Cleveland.\n"
    "Cite: Janosi, Steinbrunn, Pfisterer, Detrano (1988), UCI ML Repository,\n"
    "doi:10.24432/C52P4X; Detrano et al., Am J Cardiol 64:304-310 (1989).\n",
    "License: CC BY 4.0 (UCI ML Repository). Real public data: do not commit it into the repository.\n",
    _items,
)

#: The task's shared sets by name (listed, default first, in :data:`clients.registry.TASKS`).
SETS: Registry[SharedSet] = set_registry(HEART_DISEASE)
