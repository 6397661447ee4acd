"""What a benchmark reads of a classification site folder before a run: its training labels.

A benchmark describes its federation by site folders that the product's
generators wrote (``python -m clients.datagen``); it needs to know which site
is the smallest (the attacker of ``bench/robustness.py``) and each site's label
mix (``bench/selection_powd.py``). Both come from the folder's ``images.csv``
(``image_id,split,image,labels``; the first label is the class of a binary task).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

__all__ = ["train_labels"]


def train_labels(site_dir: Path) -> np.ndarray:
    """The first label (0/1) of every ``train`` row of the site's ``images.csv``."""
    with (Path(site_dir) / "images.csv").open(newline="") as handle:
        return np.array([int(row["labels"].split(";")[0]) for row in csv.DictReader(handle)
                         if row["split"] == "train"], dtype=np.int64)
