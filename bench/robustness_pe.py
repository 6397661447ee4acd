"""The PE-segmentation federation of the real-data attack benchmark (``bench/robustness_real.py``).

Sites: the product's shared-set converter (``python -m clients.datagen shared
--task pe-seg --set ctpa``, stratified IID over studies) cuts the shared
CTPA-like CT (``../shared/data/ctpa``: z-blocks of one CT as studies, the
TotalSegmentator pulmonary-artery mask as the label -- not a pulmonary
embolism label) into ``sites`` hospitals, each with held-out validation
studies. Every site is the product's :class:`clients.pe_seg.task.PESegTask`
(2.5D U-Net, DiceCE loss) at a tiny crop (``image_size``, ``slab_slices``);
a local update is ``task.train`` (Adam, lr ``lr``, ``tau`` steps, seeded)
from the global ``state_dict`` arrays. The metric is the validation Dice of
``task.evaluate`` (3D Dice per validation study), mean over the sites
weighted by their validation slices, of the final global model.
"""

from __future__ import annotations

import copy
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clients.registry import task_class
from clients.training.device import ComputeDevice, select_device
from clients.training.site_task import SiteTask, TaskSettings
from model_arrays import load_arrays, state_arrays
from single_thread import ROOT

__all__ = ["PeFederation", "make_pe_federation"]

SHARED = ROOT.parent / "shared" / "data"


@dataclass
class PeFederation:
    """The sites' tasks, the compute device and the local settings."""

    tasks: list[SiteTask]
    compute: ComputeDevice
    tau: int
    lr: float

    @property
    def num_examples(self) -> list[int]:
        """Training slabs per site (what an honest site declares)."""
        return [len(t.train_set) for t in self.tasks]

    def initial(self, seed: int) -> list[np.ndarray]:
        """The seeded initial global model as ``state_dict`` arrays."""
        import torch

        torch.manual_seed(seed)
        return state_arrays(self.tasks[0].build_model())

    def local_update(self, x: list[np.ndarray], site: int,
                     seed: int) -> tuple[list[np.ndarray], float]:
        """``(x - x_local, train loss)`` of ``tau`` Adam steps of the site's ``task.train``."""
        task = self.tasks[site]
        model = task.build_model()
        load_arrays(model, x)
        result = task.train(model, self.tau, self.lr, 0.9, self.compute, seed=seed,
                            optimizer="adam", label=f"robustness/{task.site_dir.name}")
        return [g - x_l for g, x_l in zip(x, state_arrays(model))], float(result.mean_loss)

    def metric(self, x: list[np.ndarray]) -> float:
        """Validation Dice of ``x``, weighted by validation slices (NaN if not finite).

        A site whose Dice is undefined (the task leaves it out) is left out with its weight.
        """
        model = self.tasks[0].build_model()
        load_arrays(model, x)
        results = [t.evaluate(copy.deepcopy(model), self.compute) for t in self.tasks]
        pairs = [(r.metrics["dice"], r.num_examples) for r in results if "dice" in r.metrics]
        if not pairs or not all(math.isfinite(d) for d, _ in pairs):
            return math.nan
        return float(sum(d * n for d, n in pairs) / sum(n for _, n in pairs))


def make_pe_federation(workdir: Path, setup: dict, seed: int) -> PeFederation:
    """Write (once) and load the ``setup["sites"]`` CTPA sites of ``seed`` under ``workdir``."""
    out = Path(workdir) / f"pe-seg-ctpa-{setup['sites']}-seed{seed}"
    if not (out / f"hospital-{setup['sites'] - 1:02d}" / "manifest.csv").is_file():
        subprocess.run([sys.executable, "-m", "clients.datagen", "shared", "--task", "pe-seg",
                        "--set", "ctpa", "--shared", str(SHARED), "--out", str(out),
                        "--sites", str(setup["sites"]), "--seed", str(seed)],
                       check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    settings = TaskSettings(image_size=setup["image_size"], slab_slices=setup["slab_slices"],
                            batch_size=setup["batch_size"])
    cls = task_class("pe-seg")
    tasks = [cls(d, settings) for d in sorted(p for p in out.iterdir() if p.is_dir())]
    return PeFederation(tasks, select_device("cpu"), setup["tau"], setup["lr"])
