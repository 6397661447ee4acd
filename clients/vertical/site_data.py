"""A site's data on the aligned patients: inputs and labels in the PSI's common order, by split.

After the private set intersection (clients/vertical/alignment.py) every site holds
the same patients in the same order; pvFed's encoders map a patient's *position*
in that order to a vector. A site's task loads its items split by split
(``task.report.loaded`` lists the loaded ids in the order train, val, test; the
split datasets' lengths give the boundaries); :func:`aligned_data` keeps the
aligned patients, puts them in the common order and says which split each is in
at this site. An item of the task that is not aligned is left out; a patient id
loaded twice (two items of one patient) counts once, its first item.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from clients.training.site_task import SiteTask
from strategies.wire.errors import SiteError

__all__ = ["SPLITS", "AlignedData", "aligned_data"]

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class AlignedData:
    """The aligned patients' items at one site, in the common order.

    Attributes
    ----------
    ids : tuple of str
        The aligned patient ids (the site's own ids; they never leave the site).
    inputs : torch.Tensor
        ``(N, ...)``: row ``i`` is patient ``ids[i]``'s input, as the task's model takes it.
    labels : torch.Tensor
        ``(N, num labels)`` 0/1 labels of the site's own task.
    positions : dict of str to numpy.ndarray
        Split (``train``, ``val``, ``test``) -> the ascending positions of its patients.
    """

    ids: tuple[str, ...]
    inputs: torch.Tensor
    labels: torch.Tensor
    positions: dict[str, np.ndarray]

    def split(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and labels of split ``name``'s aligned patients."""
        index = torch.as_tensor(self.positions[name], dtype=torch.long)
        return self.inputs[index], self.labels[index]


def _items_by_id(task: SiteTask) -> dict[str, tuple[str, int]]:
    """Loaded id -> (split, index in that split's dataset), first item of an id.

    Raises
    ------
    SiteError
        If the load report's ids do not match the split datasets' lengths.
    """
    sizes = [len(data) if data is not None else 0
             for data in (task.train_set, task.val_set, task.test_set)]
    loaded = list(task.report.loaded)
    if sum(sizes) != len(loaded):
        raise SiteError(f"{task.site_dir / task.manifest_name}: the load report lists "
                        f"{len(loaded)} items, the train/val/test sets hold {sizes}")
    found: dict[str, tuple[str, int]] = {}
    start = 0
    for split, size in zip(SPLITS, sizes):
        for index, item in enumerate(loaded[start:start + size]):
            found.setdefault(str(item), (split, index))
        start += size
    return found


def aligned_data(task: SiteTask, aligned: Sequence[str]) -> AlignedData:
    """The aligned patients' inputs and labels at this site, in the order of ``aligned``.

    Parameters
    ----------
    task : SiteTask
        The site's task, loaded (a classification task: items ``(input, label vector)``).
    aligned : sequence of str
        The aligned ids in the common order (:func:`clients.vertical.alignment.load_alignment`).

    Raises
    ------
    SiteError
        If an aligned id is not among the task's loaded items (the data changed since the
        PSI), or there is no aligned patient.
    """
    items = _items_by_id(task)
    missing = [patient for patient in aligned if patient not in items]
    if missing or not aligned:
        raise SiteError(f"{task.site_dir / task.manifest_name}: {len(missing)} of the "
                        f"{len(aligned)} aligned patients are not among the loaded items; "
                        f"run the patient alignment (PSI) again")
    datasets = dict(zip(SPLITS, (task.train_set, task.val_set, task.test_set)))
    pairs = [datasets[split][index] for split, index in (items[p] for p in aligned)]
    where = np.array([SPLITS.index(items[p][0]) for p in aligned])
    return AlignedData(
        ids=tuple(aligned),
        inputs=torch.stack([torch.as_tensor(x, dtype=torch.float32) for x, _ in pairs]),
        labels=torch.stack([torch.as_tensor(y, dtype=torch.float32) for _, y in pairs]),
        positions={split: np.flatnonzero(where == k) for k, split in enumerate(SPLITS)})
