"""A tiny radiograph site in memory and the run settings a site reads, for the site-round tests.

No Flower and no site folder: the tests call :func:`clients.site.site_round.answer` directly.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from clients.cxr_cls.task import CXRClsTask
from clients.site.policy import SitePolicy
from clients.site.instruction import SiteRunSettings
from clients.site.site import Site
from clients.training.classification import LabelledTensors
from clients.training.site_task import TaskSettings
from strategies.wire.model_layout import pack_model

SIZES = TaskSettings(image_size=16, batch_size=4)


def run_settings(**changes) -> SiteRunSettings:
    """The settings of a small SGD run of the ``cxr-cls`` task (16 px, batches of 4)."""
    run = SiteRunSettings(task="cxr-cls", sizes=SIZES, local_steps=3, optimizer="sgd", lr=0.05,
                          momentum=0.0, seed=0, num_server_rounds=2)
    return dataclasses.replace(run, **changes)


def _images(count: int, seed: int) -> LabelledTensors:
    """Noise images whose brightness gives their label away (so that training learns)."""
    rng = np.random.default_rng(seed)
    labels = [i % 2 for i in range(count)]
    return LabelledTensors([rng.normal(size=(16, 16)) + 2.0 * label - 1.0 for label in labels],
                           [np.array([label], np.float32) for label in labels])


class TinyCxr(CXRClsTask):
    """``cxr-cls`` with 12 training and 4 validation images in memory (no test split)."""

    def __init__(self, *args, **kwargs) -> None:
        self.site_dir = Path("/nonexistent/tiny")
        self.settings = SIZES
        self.train_set, self.val_set, self.test_set = _images(12, 0), _images(4, 1), None
        self.report = type("Report", (), {"skipped": {}})()


def site(tmp_path: Path, policy: SitePolicy | None = None, **changes) -> Site:
    """A site named ``hospital-a`` with its state under ``tmp_path``."""
    return Site("hospital-a", tmp_path / "data", tmp_path / "state",
                policy or SitePolicy.permissive(), cache_decoded=False, **changes)


def packed_global(private: bool = False) -> dict[str, np.ndarray]:
    """The server's initial model, packed as a train instruction carries it (seeded: an
    unseeded draw made a 20-step fit fail to lower the site's loss about 1 run in 4)."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = CXRClsTask.model_for_run(SIZES, private=private)
    return pack_model({name: value.numpy() for name, value in model.state_dict().items()})
