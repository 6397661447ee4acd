"""A task's sizes and sampling from the run config, and the local optimisers' names.

Torch-free, so that the run config can be checked (``make simulate``, ``make federate``)
without loading torch; :mod:`clients.training.site_task` uses them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from strategies.registry import Registry

__all__ = ["OPTIMIZERS", "TaskSettings"]

#: The local optimisers a run config may name (``optimizer``): ``factory(params, lr,
#: momentum)`` by dotted path into :mod:`clients.training.site_task`, imported (with torch)
#: on the first lookup, so that listing the names loads no torch.
OPTIMIZERS: Registry[Callable[..., Any]] = Registry("local optimiser", "optimizer")
OPTIMIZERS.add_path("sgd", "clients.training.site_task:sgd_optimizer")
OPTIMIZERS.add_path("adam", "clients.training.site_task:adam_optimizer")


@dataclass(frozen=True)
class TaskSettings:
    """Sizes and sampling of a task (from the run config).

    ``positive_fraction`` is the expected share of positive training examples
    the sampler draws (rare targets such as emboli would otherwise be almost
    absent from the batches): exactly that share for the classifiers (class
    balance), at least that share for segmentation (slabs with a mask are never
    down-weighted, see :mod:`clients.training.sampling`). ``num_labels`` and ``model_size`` (``small`` |
    ``full``) are for the classifiers, ``volume_depth`` (slices) for 3D volumes.
    ``augmentation`` (``none`` | ``light`` | ``strong``,
    :mod:`clients.training.augmentation_levels`) randomly transforms the classifiers'
    training images (tasks whose registry entry is ``augmentable``).
    """

    image_size: int = 64
    slab_slices: int = 9
    batch_size: int = 8
    positive_fraction: float = 0.5
    num_labels: int = 1
    model_size: str = "small"
    volume_depth: int = 32
    augmentation: str = "none"
