"""A task's sizes and sampling from the run config, the local optimisers' names, and the
site side's registries of run-config names (:data:`SITE_CHOICES`).

Torch-free, so that the run config can be checked (``make simulate``, ``make federate``)
without loading torch; :mod:`clients.training.site_task` uses them. The run-config
fields' defaults are the table's (:mod:`strategies.wire.run_keys`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from clients.training.augmentation_levels import AUGMENTATIONS
from clients.training.dp_accountants import ACCOUNTANTS
from clients.training.lr_schedule import LR_SCHEDULES
from strategies.wire.registry import Registry
from strategies.wire.run_keys import run_key

__all__ = ["OPTIMIZERS", "SITE_CHOICES", "TaskSettings"]

#: The local optimisers a run config may name (``optimizer``): ``factory(params, lr,
#: momentum)`` by dotted path into :mod:`clients.training.site_task`, imported (with torch)
#: on the first lookup, so that listing the names loads no torch.
OPTIMIZERS: Registry[Callable[..., Any]] = Registry("local optimiser", "optimizer")
OPTIMIZERS.add_path("sgd", "clients.training.site_task:sgd_optimizer")
OPTIMIZERS.add_path("adam", "clients.training.site_task:adam_optimizer")

#: The run-config keys whose names are a registry of the site side (the ``registry`` of
#: their :data:`strategies.wire.run_keys.RUN_KEYS` entry): both the server's run config and the
#: site's settings check them against these names.
SITE_CHOICES: Mapping[str, Collection[str]] = {
    "optimizer": OPTIMIZERS, "lr-schedule": LR_SCHEDULES, "augmentation": AUGMENTATIONS,
    "privacy.accountant": ACCOUNTANTS}


@dataclass(frozen=True)
class TaskSettings:
    """Sizes and sampling of a task (from the run config).

    ``positive_fraction`` is the expected share of positive training examples
    the sampler draws (rare targets such as emboli would otherwise be almost
    absent from the batches): exactly that share for the classifiers (class
    balance), at least that share for segmentation (slabs with a mask are never
    down-weighted, see :func:`clients.training.trainer.positive_share_weights`).
    ``num_labels`` is for the classifiers, ``model_size`` (``small`` | ``full``) sets the
    network's width (the classifiers' DenseNet / ResNet, pe-seg's U-Net:
    :data:`clients.pe_seg.task.UNET_SIZES`), ``volume_depth`` (slices) for 3D volumes.
    ``augmentation`` (``none`` | ``light`` | ``strong``,
    :mod:`clients.training.augmentation_levels`) randomly transforms the classifiers'
    training images (tasks whose registry entry is ``augmentable``).
    """

    image_size: int = run_key("image-size")
    slab_slices: int = run_key("slab-slices")
    batch_size: int = run_key("batch-size")
    positive_fraction: float = 0.5
    num_labels: int = run_key("num-labels")
    model_size: str = run_key("model-size")
    volume_depth: int = run_key("volume-depth")
    augmentation: str = run_key("augmentation")
