"""The two federations of ``bench/compression_fedavg.py``: what trains and what is measured.

Both expose the same small interface to the FedAvg loop
(:func:`compression_loop.run_federation`): ``name``, ``metrics``,
``num_sites``, ``num_examples(site)``, ``build_model()``,
``train_site(model, site, steps, seed) -> mean loss``, ``evaluate(model)``
and ``describe()``.

* :class:`PETask` is the product's PE segmentation: one
  :class:`clients.pe_seg.task.PESegTask` per synthetic hospital, trained and
  evaluated by the task itself (local Adam, validation Dice).
* :class:`CXRTask` is PneumoniaMNIST (:mod:`pneumoniamnist`) dealt to sites by
  the product's partitioners (:mod:`clients.datagen.partitions`), with the
  product's :class:`models.small_cnn.SmallCNN` (the product's cxr-cls task is
  a DenseNet on site folders of radiographs, too slow for nine codec configs on
  one CPU core) and the product's AUC (MONAI ``compute_roc_auc``). Only the
  local loop (random mini-batches, Adam, BCE) is written here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from clients.datagen.partitions import dirichlet_label_partition, iid_partition
from clients.pe_seg.task import PESegTask
from clients.training.device import select_device
from clients.training.site_task import TaskSettings
from models.monai_core import compute_roc_auc
from models.small_cnn import SmallCNN
from pneumoniamnist import PneumoniaMNIST, pixel_stats, standardise
from strategies.weighted_mean import weighted_mean

__all__ = ["split_sites", "CXRTask", "PETask"]


def split_sites(labels: np.ndarray, num_sites: int, seed: int, mode: str = "iid",
                alpha: float = 0.5) -> list[np.ndarray]:
    """Indices of the training examples of each site (the product's partitioners).

    ``iid``: :func:`~clients.datagen.partitions.iid_partition`; ``dirichlet``:
    :func:`~clients.datagen.partitions.dirichlet_label_partition` (Hsu et al.
    2019, at least 10 examples per site), both from one generator seeded by
    ``(seed, 0x5B17)``.
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5B17]))
    if mode == "iid":
        return iid_partition(labels.size, num_sites, rng)
    if mode != "dirichlet":
        raise ValueError(f"split must be 'iid' or 'dirichlet', got {mode!r}")
    return dirichlet_label_partition(labels, num_sites, alpha, rng, min_size=10, max_tries=100)


class CXRTask:
    """The PneumoniaMNIST federation: sites' training images, test set, local Adam."""

    metrics = ("accuracy", "auc")

    def __init__(self, data: PneumoniaMNIST, num_sites: int = 4, split: str = "iid",
                 seed: int = 0, lr: float = 1e-3, batch_size: int = 32,
                 width: Sequence[int] = (32, 64, 64), norm: str = "bn",
                 name: str = "cxr-cnn") -> None:
        self.name, self.norm = name, norm
        mean, std = pixel_stats(data.train_images)
        parts = split_sites(data.train_labels, num_sites, seed, split)
        images = torch.from_numpy(standardise(data.train_images, mean, std))
        labels = torch.from_numpy(data.train_labels.astype(np.float32))
        self.sites = [(images[p], labels[p]) for p in parts]
        self.site_labels = [data.train_labels[p] for p in parts]
        self.test_x = torch.from_numpy(standardise(data.test_images, mean, std))
        self.test_y = data.test_labels
        self.lr, self.batch_size, self.width = lr, batch_size, tuple(width)
        self.split = split

    @property
    def num_sites(self) -> int:
        return len(self.sites)

    def num_examples(self, site: int) -> int:
        return int(self.sites[site][0].shape[0])

    def build_model(self) -> nn.Module:
        return SmallCNN(self.width, self.norm)

    def train_site(self, model: nn.Module, site: int, steps: int, seed: int) -> float:
        """``steps`` Adam steps on random mini-batches (with replacement across steps)."""
        torch.manual_seed(seed)
        x, y = self.sites[site]
        gen = torch.Generator().manual_seed(seed)
        opt = torch.optim.Adam(model.parameters(), lr=self.lr)
        loss_fn = nn.BCEWithLogitsLoss()
        model.train()
        total = 0.0
        for _ in range(steps):
            idx = torch.randint(0, x.shape[0], (self.batch_size,), generator=gen)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[idx])[:, 0], y[idx])
            loss.backward()
            opt.step()
            total += loss.item()
        return total / max(steps, 1)

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Test accuracy and ROC AUC of the global model (eval mode).

        A non-finite logit (e.g. from a negative BatchNorm running variance)
        counts as a wrong prediction and as an uninformative score (0) for the
        AUC; ``nonfinite_fraction`` and ``negative_running_var`` (entries of
        the global model's BN running variances below 0) are reported alongside.
        """
        model.eval()
        logits = torch.cat([model(self.test_x[i:i + 256])[:, 0]
                            for i in range(0, self.test_x.shape[0], 256)]).numpy()
        finite = np.isfinite(logits)
        correct = finite & ((logits > 0).astype(np.int64) == self.test_y)
        negative_var = sum(int((v < 0).sum()) for k, v in model.state_dict().items()
                           if k.endswith("running_var"))
        scores = torch.from_numpy(np.where(finite, logits, 0.0))
        return {"accuracy": float(np.mean(correct)),
                "auc": float(compute_roc_auc(scores, torch.from_numpy(self.test_y))),
                "nonfinite_fraction": float(np.mean(~finite)),
                "negative_running_var": float(negative_var)}

    def describe(self) -> dict:
        return {"num_sites": self.num_sites, "split": self.split,
                "site_examples": [self.num_examples(i) for i in range(self.num_sites)],
                "site_positive_fraction": [float(np.mean(v)) for v in self.site_labels],
                "test_examples": int(self.test_y.size), "lr": self.lr,
                "batch_size": self.batch_size, "optimizer": "adam", "cnn_width": list(self.width),
                "cnn_norm": self.norm}


class PETask:
    """Synthetic hospitals, each a :class:`clients.pe_seg.task.PESegTask`."""

    name = "pe-seg"
    metrics = ("dice",)

    def __init__(self, site_dirs: Sequence[Path], image_size: int = 32, batch_size: int = 8,
                 lr: float = 3e-3, momentum: float = 0.9) -> None:
        settings = TaskSettings(image_size=image_size, batch_size=batch_size)
        self.tasks = [PESegTask(Path(d), settings) for d in site_dirs]
        self.site_names = [Path(d).name for d in site_dirs]
        self.compute = select_device("cpu")
        self.lr, self.momentum = lr, momentum
        self.image_size, self.batch_size = image_size, batch_size

    @property
    def num_sites(self) -> int:
        return len(self.tasks)

    def num_examples(self, site: int) -> int:
        return len(self.tasks[site].train_set)

    def build_model(self) -> nn.Module:
        return self.tasks[0].build_model()

    def train_site(self, model: nn.Module, site: int, steps: int, seed: int) -> float:
        result = self.tasks[site].train(model, steps, self.lr, self.momentum, self.compute,
                                        seed=seed, optimizer="adam")
        return float(result.mean_loss)

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Validation Dice, example-weighted over sites (as the product's aggregate_evaluate)."""
        results = [t.evaluate(model, self.compute) for t in self.tasks]
        dice = [float(r.metrics["dice"]) for r in results]
        out = {"dice": weighted_mean(zip(dice, (r.num_examples for r in results)))}
        out.update({f"dice_{name}": d for name, d in zip(self.site_names, dice)})
        return out

    def describe(self) -> dict:
        return {"num_sites": self.num_sites, "image_size": self.image_size,
                "batch_size": self.batch_size, "lr": self.lr, "adam_beta1": self.momentum,
                "optimizer": "adam", "sites": [{
                    "name": name, "train_slabs": len(t.train_set),
                    "val_slabs": len(t.val_set) if t.val_set else 0,
                    "val_studies": len(t.val_set.study_ids) if t.val_set else 0}
                    for name, t in zip(self.site_names, self.tasks)]}
