"""The PneumoniaMNIST federation of the real-data attack benchmark (``bench/robustness_real.py``).

The class-balanced PneumoniaMNIST train split (``bench/pneumoniamnist.py``)
is cut over the sites by the product's label-skew partitioner
(:func:`clients.datagen.partitions.dirichlet_label_partition`, Dirichlet
``alpha``; Hsu et al. 2019). The model is
``models.small_cnn.SmallCNN((8, 16), norm=None, hidden=32, num_outputs=2)``
(26,434 weights, no normalisation buffers, so every ``state_dict`` entry is a
trained float32 weight). Each round every site starts from the global model
with a fresh Adam (lr ``lr``, as the product's ``SiteTask.train``), runs
``tau`` steps of cross-entropy on mini-batches drawn uniformly with
replacement from its own data, seeded by (seed, round, site) so every
defence sees the same draws, and replies ``delta = x_global - x_local``. The
metric is the ROC AUC (MONAI ``compute_roc_auc``, as the product's
classification tasks) of the final global model on the held-out test split.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from clients.datagen.partitions import dirichlet_label_partition
from model_arrays import load_arrays, state_arrays
from models.monai_core import compute_roc_auc
from models.small_cnn import SmallCNN
from pneumoniamnist import PneumoniaMNIST, pixel_stats, standardise

__all__ = ["CxrFederation", "make_cxr_federation"]


@dataclass
class CxrFederation:
    """Sites' training tensors, the test split and the training settings."""

    images: list[torch.Tensor]
    labels: list[torch.Tensor]
    test_images: torch.Tensor
    test_labels: torch.Tensor
    tau: int
    batch_size: int
    lr: float

    @property
    def num_examples(self) -> list[int]:
        """Training examples per site (what an honest site declares)."""
        return [int(y.numel()) for y in self.labels]

    def initial(self, seed: int) -> list[np.ndarray]:
        """The seeded initial global model as ``state_dict`` arrays."""
        torch.manual_seed(seed)
        return state_arrays(self.model())

    @staticmethod
    def model() -> nn.Module:
        """A fresh (unseeded) model of the benchmark's architecture."""
        return SmallCNN((8, 16), norm=None, hidden=32, num_outputs=2)

    def local_update(self, x: list[np.ndarray], site: int,
                     seed: int) -> tuple[list[np.ndarray], float]:
        """``(x - x_local, mean train loss)`` of ``tau`` Adam steps at ``site`` from ``x``."""
        model = self.model()
        load_arrays(model, x)
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=self.lr)
        gen = torch.Generator().manual_seed(seed)
        images, labels = self.images[site], self.labels[site]
        loss_fn, losses = nn.CrossEntropyLoss(), []
        for _ in range(self.tau):
            idx = torch.randint(labels.numel(), (self.batch_size,), generator=gen)
            loss = loss_fn(model(images[idx]), labels[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        local = state_arrays(model)
        return [g - x_l for g, x_l in zip(x, local)], float(np.mean(losses))

    def metric(self, x: list[np.ndarray]) -> float:
        """Test ROC AUC of the model ``x`` (NaN if its scores are not finite)."""
        model = self.model()
        load_arrays(model, x)
        model.eval()
        with torch.no_grad():
            scores = torch.softmax(model(self.test_images), dim=1)[:, 1]
        if not torch.isfinite(scores).all():
            return float("nan")
        return float(compute_roc_auc(scores, self.test_labels))


def make_cxr_federation(data: PneumoniaMNIST, num_sites: int, alpha: float, seed: int,
                        tau: int, batch_size: int, lr: float) -> CxrFederation:
    """``num_sites`` Dirichlet(``alpha``) label-skewed sites of the train split (seeded)."""
    mean, std = pixel_stats(data.train_images)
    parts = dirichlet_label_partition(data.train_labels, num_sites, alpha,
                                      np.random.default_rng(seed))
    train = torch.from_numpy(standardise(data.train_images, mean, std))
    labels = torch.from_numpy(data.train_labels)
    return CxrFederation(
        images=[train[p] for p in parts], labels=[labels[p] for p in parts],
        test_images=torch.from_numpy(standardise(data.test_images, mean, std)),
        test_labels=torch.from_numpy(data.test_labels), tau=tau, batch_size=batch_size, lr=lr)
